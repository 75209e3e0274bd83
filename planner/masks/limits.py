"""The size past which a layout's ring rounds are taken as even rather than counted."""
from __future__ import annotations


#: runs x ranks past which a layout's rounds are taken as even (``even_rounds``): per-document zigzag and the
#: balancer cut long documents into 2P pieces, so at rings of hundreds their runs approach one per token
ROUND_CELLS = 1 << 22
