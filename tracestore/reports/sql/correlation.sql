-- description: Share of runs with a correlation id, by where it was found (SPEC section 4), and runs whose ids conflict.
--
-- One row per correlation_source ('none': no cid anywhere); the share of runs with a
-- cid is 1 - share_of_runs of 'none'. A run conflicts when its stored ids disagree: its
-- canonical cid, pipeline_metadata.trace_correlation_id and each trajectory's own cid
-- (the drift report's correlation_conflict also reads every inference URL).
WITH scope AS (
    SELECT run_pk, coalesce(correlation_source, 'none') AS correlation_source
    FROM run_facts
    WHERE ($since IS NULL OR received_at >= $since)
      AND ($until IS NULL OR received_at < $until)
      AND ($env IS NULL OR env_id = $env)
),
named AS (
    SELECT id AS run_pk, correlation_id AS cid
    FROM runs
    WHERE correlation_id IS NOT NULL
    UNION ALL
    SELECT id, json_extract_string(pipeline_metadata, '$.trace_correlation_id')
    FROM runs
    WHERE json_type(pipeline_metadata, '$.trace_correlation_id') = 'VARCHAR'
      AND regexp_matches(json_extract_string(pipeline_metadata, '$.trace_correlation_id'), '\S')
    UNION ALL
    SELECT run_pk, correlation_id
    FROM trajectories
    WHERE correlation_id IS NOT NULL
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
LEFT JOIN conflicting AS c USING (run_pk)
GROUP BY s.correlation_source
ORDER BY
    list_position(
        ['top_level', 'pipeline_metadata', 'trajectory', 'inference_url',
         'pipeline_metadata_url', 'step_inference_url', 'none'],
        s.correlation_source
    ) NULLS LAST,
    s.correlation_source;
