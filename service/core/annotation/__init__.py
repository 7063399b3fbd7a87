"""The annotation queue's release: CSPRNG pre-sampling and (β, k, ε, δ) of sampling +
k-anonymity."""
