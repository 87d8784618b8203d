"""The Kubernetes layer: the API client, watch-fed caches, the work queue and pod predicates."""
