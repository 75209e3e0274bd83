import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

torch.set_num_threads(1)

# commands that store something (`profile links`, `profile import`) never write the user's own store in tests
import tempfile  # noqa: E402

os.environ.setdefault("SP_PLAN_STORE", f"sqlite:///{tempfile.mkdtemp(prefix='sp-plan-test-store-')}/store.db")
