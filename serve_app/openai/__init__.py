"""The OpenAI surface: request models and their agentic parts (tools, `tool_choice`, `response_format`,
history), the grammars built from a request, response bodies and logprobs, and the output parsers (thought
channels, tool calls). Pure Python on the router: imports nothing of the replica or of operations."""
