"""The base of the spec's models: camelCase on the wire, snake_case in Python, nothing
unknown accepted, immutable once parsed."""

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel


class Model(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
    )
