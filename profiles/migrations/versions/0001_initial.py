"""Initial store: profiles, link fits, tune runs and their step checkpoints.

Revision ID: 0001
Revises:
"""
import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "profiles",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("cluster", sa.String(200), nullable=False, server_default=""),
        sa.Column("fingerprint", sa.String(64), nullable=False, index=True),
        sa.Column("stack", sa.JSON, nullable=False),
        sa.Column("created_at", sa.String(40), nullable=False),
        sa.Column("stored_at", sa.String(40), nullable=False),
        sa.Column("schema_version", sa.Integer, nullable=False),
        sa.Column("candidates_ok", sa.Integer, nullable=False, server_default="0"),
        sa.Column("candidates_total", sa.Integer, nullable=False, server_default="0"),
        sa.Column("loo_error_before", sa.Float, nullable=True),
        sa.Column("loo_error_after", sa.Float, nullable=True),
        sa.Column("document", sa.JSON, nullable=False),
    )
    op.create_table(
        "link_fits",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("fingerprint", sa.String(64), nullable=False, index=True),
        sa.Column("links", sa.JSON, nullable=False),
        sa.Column("created_at", sa.String(40), nullable=False),
    )
    op.create_table(
        "tune_runs",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("key", sa.String(128), nullable=False, index=True),
        sa.Column("status", sa.String(20), nullable=False),
        sa.Column("meta", sa.JSON, nullable=False),
        sa.Column("created_at", sa.String(40), nullable=False),
        sa.Column("updated_at", sa.String(40), nullable=False),
    )
    op.create_table(
        "tune_steps",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("run_id", sa.Integer, sa.ForeignKey("tune_runs.id", ondelete="CASCADE"), nullable=False, index=True),
        sa.Column("name", sa.String(1000), nullable=False),
        sa.Column("status", sa.String(20), nullable=False),
        sa.Column("payload", sa.JSON, nullable=False),
        sa.Column("updated_at", sa.String(40), nullable=False),
        sa.UniqueConstraint("run_id", "name", name="uq_tune_steps_run_name"),
    )


def downgrade() -> None:
    op.drop_table("tune_steps")
    op.drop_table("tune_runs")
    op.drop_table("link_fits")
    op.drop_table("profiles")
