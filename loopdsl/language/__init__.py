"""What a loop file is: loading, schema, model, imports, templates, compile. Pure: imports nothing above it, never LiteLLM."""
