"""The tools of llama.cpp's tests/test-chat.cpp (llama-cpp-python 0.3.36's vendored
llama.cpp), by their names there, as data: the cases ported from it use them."""

from __future__ import annotations

from typing import Any

from chat.tools import Tool


def _obj(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": required}


_INT, _STR = {"type": "integer"}, {"type": "string"}

special_function_tool = Tool("special_function", "I'm special", _obj({"arg1": _INT}, ["arg1"]))
special_function_tool_with_optional_param = Tool(
    "special_function_with_opt", "", _obj({"arg1": _INT, "arg2": _INT}, ["arg1"])
)
python_tool = Tool("python", "an ipython interpreter", _obj({"code": _STR}, ["code"]))
html_tool = Tool("html", "an html validator", _obj({"markup": _STR}, ["markup"]))
get_time_tool = Tool("get_time", "", _obj({"city": _STR}, ["city"]))
get_weather_tool = Tool("get_weather", "", _obj({"city": _STR}, ["city"]))
todo_list = Tool("todo_list", "", _obj({"todos": {"type": "array"}}, ["todos"]))
edit_tool = Tool(
    "edit", "Edit file",
    _obj({"filename": _STR, "oldString": _STR, "newString": _STR},
         ["filename", "oldString", "newString"]),
)  # fmt: skip
magic_tool = Tool("magic", "", _obj({"name": _STR, "ref": _STR}, ["name", "ref"]))
nullable_string_tool = Tool(
    "set_nullable_str", "", _obj({"name": {"type": ["string", "null"]}}, ["name"])
)
nullable_string_null_first_tool = Tool(
    "set_nullable_str_nf", "", _obj({"name": {"type": ["null", "string"]}}, ["name"])
)
nullable_int_tool = Tool(
    "set_nullable_int", "", _obj({"count": {"type": ["integer", "null"]}}, ["count"])
)
string_union_tool = Tool(
    "set_union", "",
    _obj({"value": {"type": ["string", "object"]}, "amount": {"type": ["string", "integer"]}},
         ["value", "amount"]),
)  # fmt: skip
enum_no_type_tool = Tool(
    "set_unit", "", _obj({"unit": {"enum": ["celsius", "fahrenheit"]}}, ["unit"])
)
tool_2req_4opt = Tool(
    "tool_2req_4opt", "",
    _obj({"req1": _STR, "req2": _INT, "opt1": _STR, "opt2": _INT, "opt3": _STR, "opt4": _INT},
         ["req1", "req2"]),
)  # fmt: skip
tool_2req_5opt = Tool(
    "tool_2req_5opt", "",
    _obj({"req1": _STR, "req2": _INT, "opt1": _STR, "opt2": _INT, "opt3": _STR, "opt4": _INT,
          "opt5": _STR}, ["req1", "req2"]),
)  # fmt: skip
edit_tool_oss = Tool(  # the "Complex tool calling" case of the gpt-oss tests
    "edit", "Edit a file",
    _obj({"oldString": _STR, "newString": _STR, "replaceAll": {"type": "boolean"}},
         ["oldString", "newString"]),
)  # fmt: skip
empty_args_tool = Tool("empty_args", "", {"type": "object", "properties": {}})
amount_tool = Tool("amount", "", _obj({"orig": {"type": "number"}}, ["orig"]))
toggle_tool = Tool("toggle", "", _obj({"enabled": {"type": "boolean"}}, ["enabled"]))
nullable_tool = Tool("set_nullable", "", _obj({"value": {"type": "null"}}, ["value"]))
config_tool = Tool("set_config", "", _obj({"config": {"type": "object"}}, ["config"]))
magic_int_tool = Tool("magic_int", "Magic tool that takes a hash",
                      _obj({"ref": _INT, "name": _STR}, ["ref"]))  # fmt: skip
_NUM = {"type": "number"}
imaginary_number_tool = Tool(
    "imaginary_number", "Imaginary number converter",
    _obj({"number": _obj({"real": _NUM, "imaginary": _NUM}, ["real", "imaginary"])}, ["number"]),
)  # fmt: skip
nested_args_tool = Tool(
    "nested_args", "Tool with nested array arguments",
    _obj({"tags": {"type": "array", "items": _STR},
          "entries": {"type": "array", "items": _obj({"id": _INT, "label": _STR}, ["id", "label"])}},
         ["tags", "entries"]),
)  # fmt: skip
union_args_tool = Tool(
    "union_args", "Tool with union arguments",
    {"type": "object", "properties": {
        "filter": {"anyOf": [{"type": "array", "items": _STR},
                             _obj({"field": _STR, "op": _STR}, ["field", "op"])]},
        "label": {"oneOf": [_STR, {"type": "object", "properties": {"text": _STR}}]},
        "limit": {"oneOf": [_INT, _obj({"max": _INT}, ["max"])]},
    }},
)  # fmt: skip
