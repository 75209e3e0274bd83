"""Plans computed by `sp-plan serve` (GET /v1/plans/{id}), kept across restarts.

Revision ID: 0002
Revises: 0001
"""
import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "service_plans",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("profile", sa.String(64), nullable=True),
        sa.Column("created_at", sa.String(40), nullable=False),
        sa.Column("document", sa.JSON, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("service_plans")
