"""Two named reports recomputed by Spark from a Parquet export (run by tests/lake/test_spark.py).

    <spark venv>/bin/python tests/lake/spark_reports.py EXPORT_DIR OUT.json

Runs with the Spark venv's python (scripts/spark-venv: pyspark only, no tracestore), in
local mode, with no network and no packages: it reads each table the way a Spark user
would, `spark.read.parquet(DIR/<table>)` (Spark lists the files and finds the `day`
partitions itself), then computes `returns` and `correlation` in Spark SQL, following
tracestore/reports/sql/*.sql and the views of tracestore/reports/views.sql they read.
Writes {"returns": [rows], "correlation": [rows], "tables": {table: rows},
"seconds": {...}} with rows as JSON values (dates as ISO text).
"""

from __future__ import annotations

import json
import sys
import time
from datetime import date, datetime
from typing import Any

TABLES = ("runs", "trajectories", "steps", "traces", "trace_events")

VIEWS = """
CREATE OR REPLACE TEMP VIEW run_facts AS
SELECT
    r.id AS run_pk,
    r.run_id,
    r.received_at,
    r.day,
    -- Else the id, or name, the trace's metadata gives, as ingest took it into the run's
    -- own column (Spark's get_json_object cannot tell a JSON string from a number, which
    -- views.sql's trace_id needs).
    coalesce(t0.env_id, r.env_id) AS env_id,
    coalesce(t0.policy_id, r.policy_id) AS policy_id,
    r.correlation_source,
    CASE
        WHEN r.n_steps > 0 THEN 'trajectory'
        WHEN r.trace_kind IN ('full', 'wrapped') THEN 'trace'
        ELSE 'trajectory'
    END AS step_source
FROM runs AS r
LEFT JOIN trajectories AS t0 ON t0.run_pk = r.id AND t0.idx = 0
LEFT JOIN traces AS rt ON rt.run_pk = r.id AND rt.trajectory_idx IS NULL;

CREATE OR REPLACE TEMP VIEW trace_env_steps AS
SELECT e.*, row_number() OVER (PARTITION BY e.trace_pk ORDER BY e.position) - 1 AS env_step
FROM trace_events AS e
JOIN traces AS t ON t.id = e.trace_pk AND t.trajectory_idx IS NULL
JOIN runs AS r ON r.id = t.run_pk AND r.n_steps = 0 AND r.trace_kind IN ('full', 'wrapped')
WHERE e.event_type = 'environment';

CREATE OR REPLACE TEMP VIEW episode_facts AS
SELECT rf.day, tj.env_id, tj.policy_id,
       coalesce(sr.episode_return, 0.0) AS episode_return, tj.n_steps AS episode_length
FROM trajectories AS tj
JOIN run_facts AS rf ON rf.run_pk = tj.run_pk AND rf.step_source = 'trajectory'
LEFT JOIN (
    SELECT trajectory_pk, sum(coalesce(reward, 0.0)) AS episode_return
    FROM steps GROUP BY trajectory_pk
) AS sr ON sr.trajectory_pk = tj.id
UNION ALL
SELECT rf.day, rf.env_id, rf.policy_id, er.episode_return, er.episode_length
FROM run_facts AS rf
JOIN (
    SELECT run_pk, sum(coalesce(reward, 0.0)) AS episode_return, count(*) AS episode_length
    FROM trace_env_steps GROUP BY run_pk
) AS er ON er.run_pk = rf.run_pk
WHERE rf.step_source = 'trace'
"""

RETURNS = """
SELECT
    day, env_id, policy_id,
    count(*) AS episodes,
    round(avg(episode_return), 6) AS mean_return,
    round(percentile(episode_return, 0.5), 6) AS p50_return,
    round(percentile(episode_return, 0.9), 6) AS p90_return,
    round(avg(episode_length), 6) AS mean_length
FROM episode_facts
GROUP BY day, env_id, policy_id
ORDER BY day, env_id ASC NULLS LAST, policy_id ASC NULLS LAST
"""

# DuckDB's json_type(...) = 'VARCHAR' is a JSON string value: Spark 4 tells it through
# the VARIANT type. list_position gives NULL for a source not listed; array_position 0.
CORRELATION = r"""
WITH scope AS (
    SELECT run_pk, coalesce(correlation_source, 'none') AS correlation_source FROM run_facts
),
pm AS (
    SELECT id AS run_pk,
           variant_get(parse_json(pipeline_metadata), '$.trace_correlation_id', 'variant') AS v
    FROM runs WHERE pipeline_metadata IS NOT NULL
),
named AS (
    SELECT id AS run_pk, correlation_id AS cid FROM runs WHERE correlation_id IS NOT NULL
    UNION ALL
    SELECT run_pk, variant_get(v, '$', 'string') FROM pm
    WHERE v IS NOT NULL AND schema_of_variant(v) = 'STRING'
      AND variant_get(v, '$', 'string') RLIKE '\\S'
    UNION ALL
    SELECT run_pk, correlation_id FROM trajectories WHERE correlation_id IS NOT NULL
),
conflicting AS (
    SELECT run_pk FROM named GROUP BY run_pk HAVING count(DISTINCT cid) > 1
)
SELECT
    s.correlation_source,
    count(*) AS runs,
    round(count(*) / sum(count(*)) OVER (), 6) AS share_of_runs,
    count(c.run_pk) AS conflicts
FROM scope AS s
LEFT JOIN conflicting AS c ON c.run_pk = s.run_pk
GROUP BY s.correlation_source
ORDER BY
    nullif(array_position(
        array('top_level', 'pipeline_metadata', 'trajectory', 'inference_url',
              'pipeline_metadata_url', 'step_inference_url', 'none'),
        s.correlation_source
    ), 0) ASC NULLS LAST,
    s.correlation_source
"""


def _plain(value: Any) -> Any:
    if isinstance(value, datetime | date):
        return value.isoformat()
    return value


def main() -> None:
    from pyspark.sql import SparkSession

    root, out = sys.argv[1], sys.argv[2]
    started = time.monotonic()
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("tracestore-lake-test")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    up = time.monotonic()
    counts = {}
    for table in TABLES:
        frame = spark.read.parquet(f"{root}/{table}")
        frame.createOrReplaceTempView(table)
        counts[table] = frame.count()
    for statement in VIEWS.split(";"):
        if statement.strip():
            spark.sql(statement)
    result: dict[str, Any] = {"tables": counts}
    for name, sql in (("returns", RETURNS), ("correlation", CORRELATION)):
        rows = spark.sql(sql).collect()
        result[name] = [{k: _plain(v) for k, v in row.asDict().items()} for row in rows]
    result["types"] = {
        "runs.received_at": dict(spark.table("runs").dtypes)["received_at"],
        "runs.day": dict(spark.table("runs").dtypes)["day"],
        "trace_events.event_time": dict(spark.table("trace_events").dtypes)["event_time"],
    }
    result["seconds"] = {"start": up - started, "total": time.monotonic() - started}
    spark.stop()
    with open(out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
