"""What a state does: shell, llm/evaluate, checkpoint, sub-loop."""
