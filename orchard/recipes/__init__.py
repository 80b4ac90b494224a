"""Recipes: training methods on top of rollouts (credit-assignment SFT, BAR RL, value-model
reranking) and the reference loop that runs them end to end."""
