"""The conversations our chat template is checked on against the published Gemma-4 templates (test data, used
by test_chat_template.py and by make_renderings.py, which rendered data/gemma4_renderings.json)."""

from __future__ import annotations

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather",
    "parameters": {"type": "object", "required": ["city"], "properties": {
        "city": {"type": "string", "description": "City name"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "description": "Forecast days", "nullable": True},
        "tags": {"type": "array", "items": {"type": "string"}},
        "spots": {"type": "array", "items": {"type": "object", "properties": {"lat": {"type": "number"},
                                                                             "lon": {"type": "number"}},
                                             "required": ["lat"]}},
        "where": {"type": "object", "description": "Area", "properties": {"zip": {"type": "string"}},
                  "required": ["zip"]}}}}}
PING = {"type": "function", "function": {"name": "ping", "description": "Ping"}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"Zone": {"type": "string"}, "abbr": {"type": "boolean"}}}}}
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather",
                                                       "arguments": {"city": "Paris", "unit": "celsius"}}}
CALL2 = {"id": "call_2", "type": "function", "function": {"name": "get_time",
                                                        "arguments": {"Zone": "CET", "abbr": True, "n": None,
                                                                      "x": [1, 2.5, {"b": "y"}]}}}
USER = {"role": "user", "content": "What is the weather in Paris?"}
IMAGE, AUDIO = {"type": "image"}, {"type": "audio"}

CASES = {
    "plain": {"messages": [USER]},
    "system": {"messages": [{"role": "system", "content": "  Be brief.  "}, USER]},
    "developer_parts": {"messages": [{"role": "developer", "content": [{"type": "text", "text": "Be brief."}]},
                                     {"role": "user", "content": [{"type": "text", "text": " Hi "},
                                                                  {"type": "text", "text": "there"}]}]},
    "multi_turn": {"messages": [USER, {"role": "assistant", "content": "Sunny."},
                                {"role": "user", "content": "And tomorrow?"}]},
    "thinking": {"messages": [{"role": "system", "content": "Be brief."}, USER], "enable_thinking": True},
    "thinking_only": {"messages": [USER], "enable_thinking": True},
    "tools": {"messages": [USER], "tools": [WEATHER, PING, TIME]},
    "tool_loop": {"messages": [USER, {"role": "assistant", "content": None, "tool_calls": [CALL]},
                               {"role": "tool", "tool_call_id": "call_1", "content": "18C, sunny"}],
                  "tools": [WEATHER]},
    "tool_loop_thinking": {"messages": [USER, {"role": "assistant", "content": None, "tool_calls": [CALL]},
                                        {"role": "tool", "tool_call_id": "call_1", "content": "18C, sunny"}],
                           "tools": [WEATHER], "enable_thinking": True},
    "two_calls": {"messages": [USER, {"role": "assistant", "content": None, "tool_calls": [CALL, CALL2]},
                               {"role": "tool", "tool_call_id": "call_2", "content": "12:00"},
                               {"role": "tool", "tool_call_id": "call_1", "content": "18C"}],
                  "tools": [WEATHER, TIME]},
    "content_and_calls": {"messages": [USER, {"role": "assistant", "content": "Let me check.", "tool_calls": [CALL]},
                                       {"role": "tool", "tool_call_id": "call_1", "content": "18C"}],
                          "tools": [WEATHER]},
    "split_content_then_calls": {"messages": [USER, {"role": "assistant", "content": "Let me check."},
                                              {"role": "assistant", "content": None, "tool_calls": [CALL]},
                                              {"role": "tool", "tool_call_id": "call_1", "content": "18C"}],
                                 "tools": [WEATHER], "enable_thinking": True},
    "answer_after_tool": {"messages": [USER, {"role": "assistant", "content": None, "tool_calls": [CALL]},
                                       {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
                                       {"role": "assistant", "content": "It is 18C."},
                                       {"role": "user", "content": "Thanks"}],
                          "tools": [WEATHER]},
    "reasoning_replay": {"messages": [USER, {"role": "assistant", "content": None, "tool_calls": [CALL],
                                             "reasoning_content": "I need the weather."},
                                      {"role": "tool", "tool_call_id": "call_1", "content": "18C"}],
                         "tools": [WEATHER], "enable_thinking": True},
    "reasoning_no_calls": {"messages": [USER, {"role": "assistant", "content": "Hi", "reasoning": "Greet."}],
                           "enable_thinking": True},
    "reasoning_before_last_user": {"messages": [USER, {"role": "assistant", "content": "Sunny.",
                                                       "reasoning_content": "Old thought.", "tool_calls": [CALL]},
                                                {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
                                                {"role": "user", "content": "Thanks"}],
                                   "tools": [WEATHER], "enable_thinking": True},
    "strip_thought_in_content": {"messages": [USER, {"role": "assistant",
                                                     "content": "<|channel>thought\nhmm<channel|> Sunny. "},
                                              {"role": "user", "content": "Ok"}]},
    "unknown_tool_name": {"messages": [USER, {"role": "assistant", "content": None, "tool_calls": [CALL]},
                                       {"role": "tool", "tool_call_id": "nope", "content": "x"}],
                          "tools": [WEATHER]},
    "named_tool_result": {"messages": [USER, {"role": "assistant", "content": None, "tool_calls": [CALL]},
                                       {"role": "tool", "tool_call_id": "nope", "name": "lookup",
                                        "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
                          "tools": [WEATHER]},
    "call_without_result": {"messages": [USER, {"role": "assistant", "content": None, "tool_calls": [CALL]}],
                            "tools": [WEATHER]},
    "null_arguments": {"messages": [USER, {"role": "assistant", "content": None, "tool_calls": [CALL2]},
                                    {"role": "tool", "tool_call_id": "call_2", "content": "12:00"}],
                       "tools": [TIME]},
    "preserve_thinking": {"messages": [USER, {"role": "assistant", "content": None, "tool_calls": [CALL],
                                              "reasoning_content": "Old thought."},
                                       {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
                                       {"role": "user", "content": "Thanks"}],
                          "tools": [WEATHER], "enable_thinking": True, "preserve_thinking": True},
    "assistant_continues": {"messages": [USER, {"role": "assistant", "content": "One."},
                                         {"role": "assistant", "content": "Two."}]},
    # media items (what the serve side sends: {"type": "image"} / {"type": "audio"}; the OpenAI part types too)
    "image_then_text": {"messages": [{"role": "user", "content": [IMAGE, {"type": "text", "text": " What is it? "}]}]},
    "text_then_image": {"messages": [{"role": "user", "content": [{"type": "text", "text": "Look:  "}, IMAGE]}]},
    "two_images_and_audio": {"messages": [{"role": "user", "content": [
        IMAGE, {"type": "text", "text": "and"}, IMAGE, {"type": "text", "text": "then"}, AUDIO]}]},
    "audio_only": {"messages": [{"role": "user", "content": [AUDIO]}]},
    "openai_part_types": {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}, {"type": "text", "text": "hear"},
        {"type": "input_audio", "input_audio": {"data": "AA==", "format": "wav"}}, {"type": "video"}]}]},
    "system_parts_with_image": {"messages": [{"role": "system", "content": [{"type": "text", "text": "Be brief."},
                                                                         IMAGE]}, USER]},
    "image_turn_then_text_turn": {"messages": [{"role": "user", "content": [IMAGE, {"type": "text", "text": "What?"}]},
                                               {"role": "assistant", "content": "A cat."},
                                               {"role": "user", "content": "Its colour?"}]},
    "tool_response_with_image": {"messages": [USER, {"role": "assistant", "content": None, "tool_calls": [CALL]},
                                              {"role": "tool", "tool_call_id": "call_1", "content": [
                                                  {"type": "text", "text": "Sunny, radar:"}, IMAGE]}],
                                 "tools": [WEATHER]},
}
