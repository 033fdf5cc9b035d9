"""What the client-library tests ask for: a tool, a structured output, and the checks of their results
(real behaviour of a tiny model at temperature 0: well-formed, non-empty, validating; never exact text)."""

import json

from pydantic import BaseModel, Field

PROMPT = "What is the capital of France?"
TOOL_PROMPT = "What is the weather in Paris?"
STRUCTURED_PROMPT = "John is 30 years old. Extract the person."


class GetWeather(BaseModel):
    """Get the current weather of a city."""

    city: str = Field(description="the city")


class Person(BaseModel):
    name: str
    age: int


def weather_tool(closed: bool) -> dict:
    """GetWeather as an OpenAI tool: `closed` adds `additionalProperties: false` (what strict mode sends),
    otherwise the schema is as most tools are written, open to other keys."""
    parameters = {"type": "object", "properties": {"city": {"type": "string", "description": "the city"}},
                  "required": ["city"]}
    if closed:
        parameters["additionalProperties"] = False
    return {"type": "function", "function": {"name": "GetWeather", "description": GetWeather.__doc__,
                                             "parameters": parameters}}


def check_weather_args(arguments) -> GetWeather:
    """`arguments` (a JSON string or a dict) are a complete, valid GetWeather call."""
    args = json.loads(arguments) if isinstance(arguments, str) else arguments
    assert isinstance(args, dict), f"tool arguments are not an object: {arguments!r}"
    call = GetWeather.model_validate(args)
    assert call.city.strip(), f"empty city in {arguments!r}"
    return call
