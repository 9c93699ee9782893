-- Runs once, on an empty data volume: the Prefect database is POSTGRES_DB itself;
-- the DuckLake catalog gets its own database so the two never share tables.
CREATE DATABASE ducklake;
