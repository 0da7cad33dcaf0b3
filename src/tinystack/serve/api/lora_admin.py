"""POST /v1/load_lora_adapter and /v1/unload_lora_adapter (vLLM's routes): LoRA adapters loaded and unloaded while
the server runs, behind the admin keys ([serve] admin_key_env; deps.require_admin).

    load    {"lora_name", "lora_path"} -> 200 {"status": "loaded", "lora_name"}; the path is a PEFT adapter directory
            (model/lora_adapter.py) on the server's machine. 400: the name is taken (the base's or a loaded
            adapter's), or the adapter does not fit the base or [infer] max_loras / max_lora_rank (the message
            names what differs)
    unload  {"lora_name"} -> 200 {"status": "unloaded", "lora_name"}; 404 for a name not loaded; 409 while requests
            run with it: they are never cut short (retry when they are done)

Both run on the engine's thread between two steps (AsyncEngine.call): a step never sees an adapter half loaded.
"""
from __future__ import annotations

from pydantic import Field

from tinystack.serve.api.errors import ApiError
from tinystack.serve.api.schemas import RequestBody
from tinystack.serve.state import ServerState


class LoadLoRARequest(RequestBody):
    lora_name: str = Field(min_length=1, max_length=256, description="The name requests give as `model`.")
    lora_path: str = Field(min_length=1, description="A PEFT adapter directory on the server's machine.")


class UnloadLoRARequest(RequestBody):
    lora_name: str = Field(min_length=1, max_length=256)


async def load(state: ServerState, body: LoadLoRARequest) -> dict[str, str]:
    if body.lora_name == state.model_name or body.lora_name in state.adapter.lora_names():
        raise ApiError(400, f"the name {body.lora_name!r} is taken (the base model's or a loaded adapter's)",
                       "invalid_value", param="lora_name")
    try:
        await state.adapter.add_lora(body.lora_name, body.lora_path)
    except NotImplementedError as e:  # engine replicas: adapters come with the deployment
        raise ApiError(400, str(e), "invalid_value", param="lora_name") from None
    except (ValueError, OSError) as e:
        raise ApiError(400, f"{body.lora_path}: {e}", "invalid_value", param="lora_path") from None
    return {"status": "loaded", "lora_name": body.lora_name}


async def unload(state: ServerState, body: UnloadLoRARequest) -> dict[str, str]:
    if body.lora_name not in state.adapter.lora_names():
        raise ApiError(404, f"no LoRA adapter named {body.lora_name!r} is loaded", "model_not_found",
                       param="lora_name")
    try:
        await state.adapter.remove_lora(body.lora_name)
    except NotImplementedError as e:  # engine replicas: adapters come with the deployment
        raise ApiError(400, str(e), "invalid_value", param="lora_name") from None
    except ValueError as e:  # in use: its requests finish first
        raise ApiError(409, str(e), "adapter_in_use", param="lora_name") from None
    return {"status": "unloaded", "lora_name": body.lora_name}
