-- description: Migration figures by day (SPEC section 7): trace coverage, phase-1 usable and reproducing traces, phase-2 drift rate, phase-3 legacy reads.
-- requires: drift_checks, legacy_reads
--
-- Formats: dual (dual-serialized: a trajectory step and a received trace, as the drift
-- check found them; the gate's dual_serialized_runs), legacy_only (trajectories, no
-- trace), trace_only (a trace, no trajectories); trace_coverage = runs with a received
-- trace / runs; legacy_share = runs that still send trajectories / runs. Phase 1:
-- usable_trace_share (a full or wrapped trace with an environment event, over checked
-- runs) and reproduce_share (dual runs whose trace alone gives back their steps, over
-- dual). Phase 2: drift_rate over comparable runs. Phase 3: reads of legacy trajectories
-- that day by clients (legacy_reads; not per env, so NULL with --env); as in the gate,
-- `anonymous` reads (a person looking at a run) are not counted.
WITH scope AS (
    SELECT
        rf.day,
        rf.has_trajectories,
        rf.has_trace,
        rf.trace_kind,
        rf.trace_origin,
        dc.run_pk IS NOT NULL AS checked,
        coalesce(dc.usable_trace, false) AS usable_trace,
        coalesce(dc.dual_serialized, false) AS dual_serialized,
        coalesce(dc.reproduces, false) AS reproduces,
        coalesce(dc.comparable, false) AS comparable,
        coalesce(dc.n_findings, 0) > 0 AS drifted
    FROM run_facts AS rf
    LEFT JOIN drift_checks AS dc ON dc.run_pk = rf.run_pk
    WHERE ($since IS NULL OR rf.received_at >= $since)
      AND ($until IS NULL OR rf.received_at < $until)
      AND ($env IS NULL OR rf.env_id = $env)
),
per_day AS (
    SELECT
        day,
        count(*) AS runs,
        -- The denominator of reproduce_share, as GET /v1/migration/status counts it: a run
        -- whose trajectories have no step is not dual, whatever it sent.
        count(*) FILTER (WHERE dual_serialized) AS dual,
        count(*) FILTER (WHERE has_trajectories AND NOT has_trace) AS legacy_only,
        count(*) FILTER (WHERE NOT has_trajectories AND has_trace) AS trace_only,
        count(*) FILTER (WHERE has_trace) AS with_trace,
        count(*) FILTER (WHERE has_trajectories) AS with_trajectories,
        count(*) FILTER (WHERE trace_kind IN ('full', 'wrapped')) AS full_traces,
        count(*) FILTER (WHERE trace_origin = 'converted') AS converted_traces,
        count(*) FILTER (WHERE checked) AS checked_runs,
        count(*) FILTER (WHERE usable_trace) AS usable_traces,
        count(*) FILTER (WHERE dual_serialized AND reproduces) AS reproducing,
        count(*) FILTER (WHERE comparable) AS comparable_runs,
        count(*) FILTER (WHERE comparable AND drifted) AS drifted_runs
    FROM scope
    GROUP BY day
),
reads AS (
    SELECT day, CAST(sum(reads) AS BIGINT) AS legacy_reads, count(DISTINCT client) AS clients
    FROM legacy_reads
    WHERE client <> 'anonymous'
      AND ($since IS NULL OR timezone('UTC', CAST(day AS TIMESTAMP)) + INTERVAL 1 DAY > $since)
      AND ($until IS NULL OR timezone('UTC', CAST(day AS TIMESTAMP)) < $until)
    GROUP BY day
)
SELECT
    coalesce(p.day, r.day) AS day,
    coalesce(p.runs, 0) AS runs,
    coalesce(p.dual, 0) AS dual,
    coalesce(p.legacy_only, 0) AS legacy_only,
    coalesce(p.trace_only, 0) AS trace_only,
    coalesce(p.full_traces, 0) AS full_traces,
    coalesce(p.converted_traces, 0) AS converted_traces,
    round(p.with_trace / nullif(p.runs, 0), 6) AS trace_coverage,
    round(p.with_trajectories / nullif(p.runs, 0), 6) AS legacy_share,
    coalesce(p.checked_runs, 0) AS checked_runs,
    round(p.usable_traces / nullif(p.checked_runs, 0), 6) AS usable_trace_share,
    round(p.reproducing / nullif(p.dual, 0), 6) AS reproduce_share,
    coalesce(p.comparable_runs, 0) AS comparable_runs,
    round(p.drifted_runs / nullif(p.comparable_runs, 0), 6) AS drift_rate,
    CASE WHEN $env IS NULL THEN coalesce(r.legacy_reads, 0) END AS legacy_reads,
    CASE WHEN $env IS NULL THEN coalesce(r.clients, 0) END AS legacy_clients
FROM per_day AS p
FULL OUTER JOIN reads AS r ON r.day = p.day
WHERE p.day IS NOT NULL OR $env IS NULL
ORDER BY day;
