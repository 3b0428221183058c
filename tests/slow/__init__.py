"""The slow tier: runs that solve or learn, and the Ray cluster (``ray_cluster/``)."""

from __future__ import annotations


def random_team_return(agents: int, episodes: int) -> float:
    """The mean team return (the mean of the agents' rewards, summed over an episode) of agents
    acting uniformly at random on Cooperative Navigation (``simple_spread_v3``, 25 steps)."""
    import statistics

    import numpy as np
    from mpe2 import simple_spread_v3

    env = simple_spread_v3.parallel_env(N=agents, max_cycles=25)
    rng = np.random.default_rng(0)
    returns = []
    for i in range(episodes):
        env.reset(seed=i)
        total = 0.0
        while env.agents:
            _, rewards, _, _, _ = env.step({a: int(rng.integers(5)) for a in env.agents})
            total += sum(rewards.values()) / agents
        returns.append(total)
    return statistics.fmean(returns)
