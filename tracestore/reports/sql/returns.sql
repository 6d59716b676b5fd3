-- description: Episodes, mean/p50/p90 return and mean length by env, policy and day.
--
-- An episode is a trajectory, or the trace of a run that sent no trajectory steps
-- (episode_facts in views.sql). Its return is the sum of its step rewards (null counts
-- as 0), its length its number of steps. Percentiles interpolate linearly (quantile_cont).
SELECT
    day,
    env_id,
    policy_id,
    count(*) AS episodes,
    round(favg(episode_return), 6) AS mean_return,
    round(quantile_cont(episode_return, 0.5), 6) AS p50_return,
    round(quantile_cont(episode_return, 0.9), 6) AS p90_return,
    round(favg(episode_length), 6) AS mean_length
FROM episode_facts
WHERE ($since IS NULL OR received_at >= $since)
  AND ($until IS NULL OR received_at < $until)
  AND ($env IS NULL OR env_id = $env)
GROUP BY day, env_id, policy_id
ORDER BY day, env_id NULLS LAST, policy_id NULLS LAST;
