-- description: Step-reward distribution and reward density (share of steps with a non-zero reward) by env.
--
-- Steps are decision steps (step_facts in views.sql): trajectory steps, or a trace's
-- environment events for runs that sent no trajectory steps. A null reward counts as 0
-- (SPEC section 5) and is also counted in null_rewards.
SELECT
    env_id,
    count(*) AS steps,
    count(*) FILTER (WHERE source = 'trace') AS trace_steps,
    count(*) FILTER (WHERE reward IS NULL) AS null_rewards,
    count(*) FILTER (WHERE coalesce(reward, 0.0) <> 0) AS rewarded_steps,
    round(count(*) FILTER (WHERE coalesce(reward, 0.0) <> 0) / count(*), 6) AS reward_density,
    count(*) FILTER (WHERE reward > 0) AS positive_steps,
    count(*) FILTER (WHERE reward < 0) AS negative_steps,
    round(fsum(coalesce(reward, 0.0)), 6) AS total_reward,
    round(favg(coalesce(reward, 0.0)), 6) AS mean_reward,
    round(min(coalesce(reward, 0.0)), 6) AS min_reward,
    round(quantile_cont(coalesce(reward, 0.0), 0.5), 6) AS p50_reward,
    round(quantile_cont(coalesce(reward, 0.0), 0.9), 6) AS p90_reward,
    round(quantile_cont(coalesce(reward, 0.0), 0.99), 6) AS p99_reward,
    round(max(coalesce(reward, 0.0)), 6) AS max_reward
FROM step_facts
WHERE ($since IS NULL OR received_at >= $since)
  AND ($until IS NULL OR received_at < $until)
  AND ($env IS NULL OR env_id = $env)
GROUP BY env_id
ORDER BY env_id NULLS LAST;
