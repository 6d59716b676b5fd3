-- description: LLM calls, input/output tokens, cost and latency percentiles by model and provider (from trace events).
--
-- Every lm_call event of a run's received traces counts once (event_facts in
-- views.sql); traces tracestore converted from trajectories are left out. Sums skip
-- nulls; calls_with_cost and calls_with_latency say how many calls reported each.
SELECT
    model_name,
    provider,
    count(*) AS calls,
    count(DISTINCT run_pk) AS runs,
    CAST(sum(input_tokens) AS BIGINT) AS input_tokens,
    CAST(sum(output_tokens) AS BIGINT) AS output_tokens,
    CAST(sum(total_tokens) AS BIGINT) AS total_tokens,
    round(fsum(cost_usd), 6) AS cost_usd,
    count(cost_usd) AS calls_with_cost,
    count(latency_ms) AS calls_with_latency,
    round(favg(latency_ms), 3) AS mean_latency_ms,
    round(quantile_cont(latency_ms, 0.5), 3) AS p50_latency_ms,
    round(quantile_cont(latency_ms, 0.9), 3) AS p90_latency_ms,
    round(quantile_cont(latency_ms, 0.99), 3) AS p99_latency_ms
FROM event_facts
WHERE event_type = 'lm_call'
  AND trace_origin = 'received'
  AND ($since IS NULL OR received_at >= $since)
  AND ($until IS NULL OR received_at < $until)
  AND ($env IS NULL OR env_id = $env)
GROUP BY model_name, provider
ORDER BY calls DESC, model_name NULLS LAST, provider NULLS LAST;
