"""What producers send (SPEC.md): lenient parsing helpers and wire models."""
