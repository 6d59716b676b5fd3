-- description: Drift findings by day, env and kind, with the drift rate of each day and env (comparable runs with a finding).
-- requires: drift_checks, drift_findings
--
-- One row per (day, env_id, kind) with findings, and one with kind NULL for a day and
-- env without any. findings and runs_with_kind count that kind; runs .. drift_rate
-- describe the whole day and env: its runs, those with a drift check, the comparable
-- ones (SPEC section 6) and those of them with at least one finding. drift_rate is
-- drifted_runs / comparable_runs, as in GET /v1/drift. A run counts under each of its
-- envs, as GET /v1/drift's env filter and by_env count it: every trajectory's env_id, and
-- the run's own (its first trajectory's, else its trace metadata's); a run of two envs
-- is in both groups, with all its findings.
WITH run_envs AS (
    SELECT DISTINCT run_pk, env_id
    FROM (
        SELECT run_pk, env_id FROM trajectories WHERE env_id IS NOT NULL
        UNION ALL
        SELECT run_pk, env_id FROM run_facts
    )
),
scope AS (
    SELECT
        rf.run_pk,
        rf.day,
        re.env_id,
        dc.run_pk IS NOT NULL AS checked,
        coalesce(dc.comparable, false) AS comparable,
        coalesce(dc.n_findings, 0) > 0 AS drifted
    FROM run_facts AS rf
    JOIN run_envs AS re ON re.run_pk = rf.run_pk
    LEFT JOIN drift_checks AS dc ON dc.run_pk = rf.run_pk
    WHERE ($since IS NULL OR rf.received_at >= $since)
      AND ($until IS NULL OR rf.received_at < $until)
      AND ($env IS NULL OR re.env_id = $env)
),
per_group AS (
    SELECT
        day,
        env_id,
        count(*) AS runs,
        count(*) FILTER (WHERE checked) AS checked_runs,
        count(*) FILTER (WHERE comparable) AS comparable_runs,
        count(*) FILTER (WHERE comparable AND drifted) AS drifted_runs
    FROM scope
    GROUP BY day, env_id
),
per_kind AS (
    SELECT s.day, s.env_id, f.kind, count(*) AS findings, count(DISTINCT f.run_pk) AS runs
    FROM drift_findings AS f
    JOIN scope AS s USING (run_pk)
    GROUP BY s.day, s.env_id, f.kind
)
SELECT
    g.day,
    g.env_id,
    k.kind,
    coalesce(k.findings, 0) AS findings,
    coalesce(k.runs, 0) AS runs_with_kind,
    g.runs,
    g.checked_runs,
    g.comparable_runs,
    g.drifted_runs,
    round(g.drifted_runs / nullif(g.comparable_runs, 0), 6) AS drift_rate
FROM per_group AS g
LEFT JOIN per_kind AS k ON k.day = g.day AND k.env_id IS NOT DISTINCT FROM g.env_id
ORDER BY g.day, g.env_id NULLS LAST, k.kind NULLS FIRST;
