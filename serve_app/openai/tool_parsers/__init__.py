"""Tool-call parsers: a model's raw output text (control tokens kept) -> OpenAI `tool_calls`."""
