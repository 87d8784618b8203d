"""The ModelServer resource: its spec and status types, validation messages, the CRD generated from
them, and the objects one ModelServer becomes (pure functions: spec -> manifests)."""
