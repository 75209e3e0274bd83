"""Alembic environment: the Store hands over its open connection (config.attributes['connection'])."""
from alembic import context

from sp_plan.profiles.store import VERSION_TABLE

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=None, version_table=VERSION_TABLE, render_as_batch=connection.dialect.name == "sqlite")
with context.begin_transaction():
    context.run_migrations()
