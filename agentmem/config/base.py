"""The base of every config model, and the checks that several configs share."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationInfo

from agentmem.config.choices import AttentionPath, DType, Packing
from agentmem.records import CallKind, InvocationKind


class Frozen(BaseModel):
    # a field's docstring is its description: the help of its CLI option (``cli.config_options``)
    model_config = ConfigDict(frozen=True, extra="forbid", use_enum_values=False, use_attribute_docstrings=True)


KIND_ALIASES = {"update": InvocationKind.memory_update.value}
# the kinds of calls recorded by ``agentmem serve`` that name no kind of their own (``X-Agentmem-Kind``)
SERVE_KINDS = ("chat", "completion")


def kind_names(value: Any) -> Any:
    """``--kinds``: a comma-separated string or a list of call kinds (``update`` = ``memory_update``). Which
    kinds exist is the memory policies' to say: the jobs check them against the registry
    (``agentmem.agent.registry.check_kinds``), before any model loads."""
    if isinstance(value, str):
        value = [v.strip() for v in value.split(",") if v.strip()]
    if not isinstance(value, list):
        return value
    if not value:
        raise ValueError("give at least one call kind (or none of the option: every kind)")
    return [KIND_ALIASES.get(v, v) if isinstance(v, str) else v for v in value]


def mixed_over_float32(value: bool, info: ValidationInfo) -> bool:
    dtype = info.data.get("dtype")
    if value and dtype is not None and DType(dtype) is not DType.float32:
        raise ValueError(f"mixed_precision keeps float32 weights and runs their decoder in bfloat16: it needs "
                         f"dtype=float32, got dtype={DType(dtype).value} (give one of the two)")
    return value


# The field types that several jobs share, each with its check or its help (a field's docstring, where it
# has one, replaces the help given here)
Kinds = Annotated[list[CallKind] | None, BeforeValidator(kind_names)]
MixedPrecision = Annotated[bool, AfterValidator(mixed_over_float32)]  # after the model's dtype field: reads it
PackedPath = Annotated[AttentionPath, Field(description=(
    "Packed attention path: fast (per-segment attention, flash-attn varlen on CUDA) or reference (a 4-D\n"
    "block mask)."))]
RowLayout = Annotated[Packing, Field(description=(
    "Row layout: segments (each call whole) or shared_prefix (a (run, task, step) group's common prompt\n"
    "prefix placed and computed once; exact)."))]
