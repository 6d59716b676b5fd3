"""DuckDB analytics over the store: named reports, ad-hoc SQL, and Parquet snapshots.

The only home of duckdb in tracestore. Report SQL lives in `sql/*.sql`, the views every
source provides in `views.sql`; `connection` opens DuckDB over a live store or a snapshot,
`runner` runs reports and queries, `output` renders results, `export` writes snapshots.
Importing this package stays light: duckdb and pyarrow load with those modules.
"""
