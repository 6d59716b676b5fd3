-- description: Tool-call frequency by env and tool name (every tool-call dialect normalized).
--
-- Calls come from trajectory steps, or from the trace for runs that sent no trajectory
-- steps (tool_call_facts in views.sql). The name is read as tracestore.toolcalls reads
-- it: OpenAI's function.name, else tool_name, name or tool. share_of_env_calls is the
-- tool's share of all calls in its env.
SELECT
    env_id,
    tool_name,
    count(*) AS calls,
    count(DISTINCT (run_pk, source, trajectory_idx, step_idx)) AS steps,
    count(DISTINCT run_pk) AS runs,
    round(count(*) / sum(count(*)) OVER (PARTITION BY env_id), 6) AS share_of_env_calls
FROM tool_call_facts
WHERE ($since IS NULL OR received_at >= $since)
  AND ($until IS NULL OR received_at < $until)
  AND ($env IS NULL OR env_id = $env)
GROUP BY env_id, tool_name
ORDER BY env_id NULLS LAST, calls DESC, tool_name NULLS LAST;
