-- Friendly views over the store's tables, created in every analytics connection after the
-- tables themselves (runs, trajectories, steps, traces, trace_time_steps, trace_events,
-- trace_messages, drift_checks, drift_findings, legacy_reads) with normalized types:
-- timestamps are TIMESTAMPTZ in UTC, JSON columns are DuckDB JSON. The reports read these
-- views, so they give the same figures on SQLite, PostgreSQL and a Parquet snapshot.
--
-- Conventions the reports rely on:
-- * day: the UTC date a run was received; every row of a run has its run's day.
-- * env_id / policy_id: a trajectory's own on trajectory rows; on run, trace and event
--   rows the run's: its first trajectory's, else its run-level trace's metadata's
--   env_id / policy_id, else (that id absent or null) its env_name / policy_name
--   (synth-ai's traces name them so), each taken only as ingest takes an id (trace_id).
-- * step_source: where a run's decision steps come from. 'trajectory' when the run has
--   trajectory steps; 'trace' when it has none but a full or wrapped trace (the
--   environment events are its steps, SPEC section 5); else 'trajectory' (its
--   trajectories, if any, are episodes of length 0). Converted traces never count twice:
--   they only exist for runs that have trajectory steps.

-- The name of one tool call in any SPEC section 5 dialect, as
-- tracestore.toolcalls.normalize_tool_call reads it: OpenAI's function.name, else the
-- first of tool_name, name, tool that is present (even when null).
CREATE OR REPLACE MACRO tool_call_name(call) AS
    CASE
        WHEN json_type(call) IS DISTINCT FROM 'OBJECT' THEN NULL
        WHEN json_type(call, '$.function') = 'OBJECT' THEN json_extract_string(call, '$.function.name')
        WHEN json_exists(call, '$.tool_name') THEN json_extract_string(call, '$.tool_name')
        WHEN json_exists(call, '$.name') THEN json_extract_string(call, '$.name')
        ELSE json_extract_string(call, '$.tool')
    END;

-- A trace metadata's value at `path` as an id, as ingest takes it
-- (ingest/project.py _named_id): a string of at most 1,024 UTF-8 bytes, else NULL.
CREATE OR REPLACE MACRO trace_name(meta, path) AS
    CASE
        WHEN json_type(meta, path) = 'VARCHAR' AND strlen(json_extract_string(meta, path)) <= 1024
        THEN json_extract_string(meta, path)
    END;

-- A trace metadata's env / policy id, as ingest takes it (ingest/project.py _trace_name):
-- its id (`id_path`) when that is an id; its name (`name_path`) only when the id is absent
-- or null. A present value that is no id (a number, an object, a longer string) gives
-- NULL, as runs.env_id has it.
CREATE OR REPLACE MACRO trace_id(meta, id_path, name_path) AS
    CASE
        WHEN coalesce(json_type(meta, id_path), 'NULL') = 'NULL' THEN trace_name(meta, name_path)
        ELSE trace_name(meta, id_path)
    END;

-- The elements of a JSON array (no rows for anything else).
CREATE OR REPLACE MACRO json_elements(value) AS
    CASE WHEN json_type(value) = 'ARRAY' THEN CAST(value AS JSON[]) ELSE [] END;

-- One row per run.
CREATE OR REPLACE VIEW run_facts AS
SELECT
    r.id AS run_pk,
    r.run_id,
    r.received_at,
    CAST(timezone('UTC', r.received_at) AS DATE) AS day,
    coalesce(t0.env_id, trace_id(rt.metadata, '$.env_id', '$.env_name')) AS env_id,
    coalesce(t0.policy_id, trace_id(rt.metadata, '$.policy_id', '$.policy_name')) AS policy_id,
    r.correlation_id,
    r.correlation_source,
    r.trace_kind,
    rt.origin AS trace_origin,
    r.n_trajectories > 0 AS has_trajectories,
    r.trace_kind IS NOT NULL AS has_trace,
    CASE
        WHEN r.n_steps > 0 THEN 'trajectory'
        WHEN r.trace_kind IN ('full', 'wrapped') THEN 'trace'
        ELSE 'trajectory'
    END AS step_source,
    r.n_trajectories,
    r.n_steps,
    r.n_events,
    r.n_messages,
    r.mean_return,
    r.num_steps,
    r.num_episodes,
    r.aborted,
    r.doc_bytes
FROM runs AS r
LEFT JOIN trajectories AS t0 ON t0.run_pk = r.id AND t0.idx = 0
LEFT JOIN traces AS rt ON rt.run_pk = r.id AND rt.trajectory_idx IS NULL;

-- The decision steps of runs whose steps come from their trace: the environment events
-- of their run-level trace, numbered from 0 in trace order.
CREATE OR REPLACE VIEW trace_env_steps AS
SELECT
    e.*,
    row_number() OVER (PARTITION BY e.trace_pk ORDER BY e.position) - 1 AS env_step
FROM trace_events AS e
JOIN traces AS t ON t.id = e.trace_pk AND t.trajectory_idx IS NULL
JOIN runs AS r ON r.id = t.run_pk AND r.n_steps = 0 AND r.trace_kind IN ('full', 'wrapped')
WHERE e.event_type = 'environment';

-- One row per decision step: a trajectory step, or an environment event of a run whose
-- steps come from its trace.
CREATE OR REPLACE VIEW step_facts AS
SELECT
    s.run_pk,
    rf.run_id,
    rf.received_at,
    rf.day,
    tj.env_id,
    tj.policy_id,
    'trajectory' AS source,
    tj.idx AS trajectory_idx,
    s.idx AS step_idx,
    s.reward,
    s.done,
    s.truncated,
    s.id AS step_pk,
    CAST(NULL AS BIGINT) AS event_pk
FROM steps AS s
JOIN trajectories AS tj ON tj.id = s.trajectory_pk
JOIN run_facts AS rf ON rf.run_pk = s.run_pk
UNION ALL
SELECT
    e.run_pk,
    rf.run_id,
    rf.received_at,
    rf.day,
    rf.env_id,
    rf.policy_id,
    'trace' AS source,
    CAST(NULL AS BIGINT) AS trajectory_idx,
    e.env_step AS step_idx,
    e.reward,
    e.terminated AS done,
    e.truncated,
    CAST(NULL AS BIGINT) AS step_pk,
    e.id AS event_pk
FROM trace_env_steps AS e
JOIN run_facts AS rf ON rf.run_pk = e.run_pk AND rf.step_source = 'trace';

-- One row per episode: a trajectory, or the trace of a run whose steps come from it.
-- The return is the sum of step rewards, a null reward counting as 0 (SPEC section 5).
CREATE OR REPLACE VIEW episode_facts AS
SELECT
    rf.run_pk,
    rf.run_id,
    rf.received_at,
    rf.day,
    tj.env_id,
    tj.policy_id,
    'trajectory' AS source,
    tj.idx AS trajectory_idx,
    coalesce(sr.episode_return, 0.0) AS episode_return,
    tj.n_steps AS episode_length
FROM trajectories AS tj
JOIN run_facts AS rf ON rf.run_pk = tj.run_pk AND rf.step_source = 'trajectory'
LEFT JOIN (
    SELECT trajectory_pk, fsum(coalesce(reward, 0.0)) AS episode_return
    FROM steps
    GROUP BY trajectory_pk
) AS sr ON sr.trajectory_pk = tj.id
UNION ALL
SELECT
    rf.run_pk,
    rf.run_id,
    rf.received_at,
    rf.day,
    rf.env_id,
    rf.policy_id,
    'trace' AS source,
    CAST(NULL AS BIGINT) AS trajectory_idx,
    er.episode_return,
    er.episode_length
FROM run_facts AS rf
JOIN (
    SELECT run_pk, fsum(coalesce(reward, 0.0)) AS episode_return, count(*) AS episode_length
    FROM trace_env_steps
    GROUP BY run_pk
) AS er ON er.run_pk = rf.run_pk
WHERE rf.step_source = 'trace';

-- One row per trace event of a run's primary traces: its run-level trace, or its
-- per-trajectory traces when it has none. trace_origin tells received from converted.
CREATE OR REPLACE VIEW event_facts AS
SELECT
    e.run_pk,
    rf.run_id,
    rf.received_at,
    rf.day,
    rf.env_id,
    rf.policy_id,
    t.origin AS trace_origin,
    t.kind AS trace_kind,
    t.trajectory_idx,
    e.id AS event_pk,
    e.trace_pk,
    e.position,
    e.event_type,
    e.reward,
    e.terminated,
    e.truncated,
    e.model_name,
    e.provider,
    e.input_tokens,
    e.output_tokens,
    e.total_tokens,
    e.cost_usd,
    e.latency_ms,
    e.event_time
FROM trace_events AS e
JOIN traces AS t ON t.id = e.trace_pk
JOIN run_facts AS rf ON rf.run_pk = e.run_pk
WHERE t.trajectory_idx IS NULL
   OR NOT EXISTS (
       SELECT 1 FROM traces AS rl WHERE rl.run_pk = t.run_pk AND rl.trajectory_idx IS NULL
   );

-- One row per tool call of a decision step (step_facts), normalized name included.
-- Trace steps take their calls as tracestore.wire.trace.time_step_tool_calls does, from
-- the first source that gives any: the time step's messages with metadata.is_tool_call
-- (json_payload -> tool_calls); its policy_tool_call and action messages (their content,
-- the JSON payload else the text as JSON: a list of calls, or an object's tool_calls);
-- its LM events' call_records[*].output_tool_calls; the environment event's own
-- metadata.tool_calls. Items outside every time step join the one whose step_id equals
-- their metadata.step_id (an unknown step_id groups them by itself).
CREATE OR REPLACE VIEW tool_call_facts AS
WITH trace_runs AS (
    SELECT t.id AS trace_pk, rf.run_pk, rf.run_id, rf.received_at, rf.day, rf.env_id,
           rf.policy_id
    FROM traces AS t
    JOIN run_facts AS rf ON rf.run_pk = t.run_pk AND rf.step_source = 'trace'
    WHERE t.trajectory_idx IS NULL
),
step_ids AS (
    SELECT ts.trace_pk, ts.step_id, arg_min(ts.id, ts.position) AS time_step_pk
    FROM trace_time_steps AS ts
    JOIN trace_runs USING (trace_pk)
    WHERE ts.step_id IS NOT NULL
    GROUP BY ts.trace_pk, ts.step_id
),
keyed_events AS (
    -- The step_id an event outside every time step names (its key to one).
    SELECT
        e.id, e.trace_pk, e.position, e.event_type, e.call_records, e.metadata,
        e.time_step_pk,
        CASE
            WHEN e.time_step_pk IS NULL AND json_type(e.metadata, '$.step_id') = 'VARCHAR'
                THEN json_extract_string(e.metadata, '$.step_id')
        END AS named_step
    FROM trace_events AS e
    JOIN trace_runs AS tr USING (trace_pk)
),
grouped_events AS (
    SELECT
        e.*,
        CASE
            WHEN e.time_step_pk IS NOT NULL THEN 'p' || e.time_step_pk
            WHEN si.time_step_pk IS NOT NULL THEN 'p' || si.time_step_pk
            WHEN e.named_step IS NOT NULL THEN 's' || e.named_step
        END AS grp
    FROM keyed_events AS e
    LEFT JOIN step_ids AS si ON si.trace_pk = e.trace_pk AND si.step_id = e.named_step
),
keyed_messages AS (
    SELECT
        m.trace_pk, m.position, m.json_payload, m.text, m.time_step_pk,
        coalesce(
            json_type(m.metadata, '$.is_tool_call') = 'BOOLEAN'
            AND json_extract_string(m.metadata, '$.is_tool_call') = 'true',
            false
        ) AS is_call,
        coalesce(m.message_type IN ('policy_tool_call', 'action'), false) AS typed,
        CASE
            WHEN m.time_step_pk IS NULL AND json_type(m.metadata, '$.step_id') = 'VARCHAR'
                THEN json_extract_string(m.metadata, '$.step_id')
        END AS named_step
    FROM trace_messages AS m
    JOIN trace_runs AS tr USING (trace_pk)
    WHERE (
        json_type(m.metadata, '$.is_tool_call') = 'BOOLEAN'
        AND json_extract_string(m.metadata, '$.is_tool_call') = 'true'
    ) OR m.message_type IN ('policy_tool_call', 'action')
),
grouped_messages AS (
    SELECT
        m.*,
        CASE
            WHEN m.time_step_pk IS NOT NULL THEN 'p' || m.time_step_pk
            WHEN si.time_step_pk IS NOT NULL THEN 'p' || si.time_step_pk
            WHEN m.named_step IS NOT NULL THEN 's' || m.named_step
        END AS grp
    FROM keyed_messages AS m
    LEFT JOIN step_ids AS si ON si.trace_pk = m.trace_pk AND si.step_id = m.named_step
),
message_calls AS (
    SELECT trace_pk, grp, unnest(json_elements(json_extract(TRY_CAST(json_payload AS JSON), '$.tool_calls'))) AS call
    FROM grouped_messages
    WHERE grp IS NOT NULL AND is_call AND json_valid(json_payload)
),
typed_values AS (
    -- A tool-call message's content as a value: its JSON payload (unless null), else its
    -- text when that is JSON (wire.trace.message_value).
    SELECT
        trace_pk, grp,
        CASE
            WHEN json_valid(json_payload) AND json_type(TRY_CAST(json_payload AS JSON)) <> 'NULL'
                THEN TRY_CAST(json_payload AS JSON)
            WHEN json_valid(text) THEN TRY_CAST(text AS JSON)
        END AS value
    FROM grouped_messages
    WHERE grp IS NOT NULL AND typed
),
typed_calls AS (
    -- A list holds the calls (its objects); an object holds them as tool_calls.
    SELECT trace_pk, grp, unnest(
        CASE
            WHEN json_type(value) = 'ARRAY'
                THEN list_filter(json_elements(value), c -> json_type(c) = 'OBJECT')
            WHEN json_type(value) = 'OBJECT' AND json_type(value, '$.tool_calls') = 'ARRAY'
                THEN json_elements(json_extract(value, '$.tool_calls'))
        END
    ) AS call
    FROM typed_values
),
lm_records AS (
    SELECT trace_pk, grp, unnest(json_elements(call_records)) AS record
    FROM grouped_events
    WHERE grp IS NOT NULL AND event_type = 'lm_call'
),
lm_calls AS (
    SELECT trace_pk, grp, unnest(json_elements(json_extract(record, '$.output_tool_calls'))) AS call
    FROM lm_records
),
env_events AS (
    -- Numbered as trace_env_steps numbers them (read from grouped_events: one scan less).
    SELECT
        id, trace_pk, grp, metadata,
        row_number() OVER (PARTITION BY trace_pk ORDER BY position) - 1 AS env_step
    FROM grouped_events
    WHERE event_type = 'environment'
),
env_calls AS (
    -- Every environment event takes the calls of the first source that has any.
    SELECT ev.id, ev.trace_pk, ev.env_step, mc.call
    FROM env_events AS ev
    JOIN message_calls AS mc ON mc.trace_pk = ev.trace_pk AND mc.grp = ev.grp
    UNION ALL
    SELECT ev.id, ev.trace_pk, ev.env_step, tc.call
    FROM env_events AS ev
    JOIN typed_calls AS tc ON tc.trace_pk = ev.trace_pk AND tc.grp = ev.grp
    WHERE NOT EXISTS (
        SELECT 1 FROM message_calls AS mc WHERE mc.trace_pk = ev.trace_pk AND mc.grp = ev.grp
    )
    UNION ALL
    SELECT ev.id, ev.trace_pk, ev.env_step, lc.call
    FROM env_events AS ev
    JOIN lm_calls AS lc ON lc.trace_pk = ev.trace_pk AND lc.grp = ev.grp
    WHERE NOT EXISTS (
        SELECT 1 FROM message_calls AS mc WHERE mc.trace_pk = ev.trace_pk AND mc.grp = ev.grp
    )
      AND NOT EXISTS (
        SELECT 1 FROM typed_calls AS tc WHERE tc.trace_pk = ev.trace_pk AND tc.grp = ev.grp
    )
    UNION ALL
    SELECT own.id, own.trace_pk, own.env_step, own.call
    FROM (
        SELECT id, trace_pk, env_step, grp,
               unnest(json_elements(json_extract(metadata, '$.tool_calls'))) AS call
        FROM env_events
    ) AS own
    WHERE NOT EXISTS (
        SELECT 1 FROM message_calls AS mc WHERE mc.trace_pk = own.trace_pk AND mc.grp = own.grp
    )
      AND NOT EXISTS (
        SELECT 1 FROM typed_calls AS tc WHERE tc.trace_pk = own.trace_pk AND tc.grp = own.grp
    )
      AND NOT EXISTS (
        SELECT 1 FROM lm_calls AS lc WHERE lc.trace_pk = own.trace_pk AND lc.grp = own.grp
    )
)
SELECT
    s.run_pk,
    rf.run_id,
    rf.received_at,
    rf.day,
    tj.env_id,
    tj.policy_id,
    'trajectory' AS source,
    tj.idx AS trajectory_idx,
    s.idx AS step_idx,
    tool_call_name(s.call) AS tool_name,
    s.call
FROM (
    SELECT run_pk, trajectory_pk, idx, unnest(json_elements(tool_calls)) AS call FROM steps
) AS s
JOIN trajectories AS tj ON tj.id = s.trajectory_pk
JOIN run_facts AS rf ON rf.run_pk = s.run_pk
UNION ALL
SELECT
    tr.run_pk,
    tr.run_id,
    tr.received_at,
    tr.day,
    tr.env_id,
    tr.policy_id,
    'trace' AS source,
    CAST(NULL AS BIGINT) AS trajectory_idx,
    ec.env_step AS step_idx,
    tool_call_name(ec.call) AS tool_name,
    ec.call
FROM env_calls AS ec
JOIN trace_runs AS tr ON tr.trace_pk = ec.trace_pk;
