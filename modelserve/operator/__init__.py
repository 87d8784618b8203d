"""modelserve-operator: reconciles ModelServers into Deployments and Services, and scales them."""
