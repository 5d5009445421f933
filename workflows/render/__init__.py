"""Release spec -> what is deployed: the Ray Serve LLM serve config, the kustomize manifest, the PodDisruptionBudgets,
and one typed view of the result (rendered.RenderedRelease) that every check and target reads."""
