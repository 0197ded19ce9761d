"""Persistence: SQLAlchemy 2 models and repositories. The schema exists only through Alembic."""
