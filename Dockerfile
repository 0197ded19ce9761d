FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY service ./service
COPY migrations ./migrations
RUN pip install --no-cache-dir .
EXPOSE 8000
# Check the PLANNER_ settings (exit 2 naming each bad one), migrate (one container at a time on
# PostgreSQL; not a database a later release migrated, for rollbacks), then serve; compose makes the
# database healthy first.
CMD ["sh", "-c", "python -m service.settings && python -m service.persistence.schema && uvicorn service.main:create_app --factory --no-access-log --host 0.0.0.0 --port 8000"]
