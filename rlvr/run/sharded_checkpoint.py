"""The sharded part of a checkpoint: FSDP2-sharded models and their optimizers, written and read by
every rank with ``torch.distributed.checkpoint`` (DCP).

Each rank writes its own shards into ``step_N/sharded/<name>/`` (one file per rank, plus DCP's
metadata from rank 0), so no rank ever holds a whole model or optimizer state. They are written
into the checkpoint's temporary folder before rank 0 writes the rest and renames it into place
(:func:`rlvr.run.ranks.save_run_checkpoint`): a crash leaves no half checkpoint. A model is read
back into the freshly sharded model at load time (:func:`load_sharded_model`); an optimizer when
the run restores its states (:func:`load_sharded_optimizer`). Resuming takes the same number of
ranks for bit-identical continuation; DCP reshards on load, so another world size loads too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from rlvr.run.sharding import is_sharded

#: The folder of a checkpoint that holds the sharded models and optimizers.
SHARDED = "sharded"


def has_sharded_part(checkpoint: str | Path) -> bool:
    """Whether a checkpoint was written by a sharded run (its weights are under ``sharded/``)."""
    return (Path(checkpoint) / SHARDED).is_dir()


@dataclass
class ShardedParts:
    """The models of a run that are sharded (by name) and the optimizers over their parameters (by
    the name of their state): what :func:`save` writes with DCP instead of ``save_pretrained`` and
    ``trainer_state.pt``."""

    models: dict[str, torch.nn.Module] = field(default_factory=dict)
    optimizers: dict[str, tuple[torch.optim.Optimizer, torch.nn.Module]] = field(default_factory=dict)

    @classmethod
    def of(cls, models: dict, states: dict) -> "ShardedParts":
        """The sharded ones among a run's ``models`` and the optimizers among its ``states`` that train them."""
        return cls._with(models, states, {name: model for name, model in models.items() if is_sharded(model)})

    @classmethod
    def in_checkpoint(cls, checkpoint: str | Path, models: dict, states: dict) -> "ShardedParts":
        """The models of a run whose weights ``checkpoint`` holds as shards, sharded now or not, and their
        optimizers: a checkpoint of an FSDP2 run resumed on one process (which runs unsharded) loads
        them from the shards, as DCP reshards on load."""
        written = {name: model for name, model in models.items() if (Path(checkpoint) / SHARDED / name).is_dir()}
        return cls._with(models, states, written)

    @classmethod
    def _with(cls, models: dict, states: dict, sharded: dict) -> "ShardedParts":
        owner = {id(p): model for model in sharded.values() for p in model.parameters()}
        optimizers = {}
        for name, state in states.items():
            if isinstance(state, torch.optim.Optimizer):
                params = [p for group in state.param_groups for p in group["params"]]
                if params and id(params[0]) in owner:
                    optimizers[name] = (state, owner[id(params[0])])
        return cls(sharded, optimizers)

    def __bool__(self) -> bool:
        return bool(self.models)

    def save(self, folder: Path) -> None:
        """Every rank writes its shards of each model and optimizer under ``folder`` (a collective)."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

        for name, model in self.models.items():
            dcp.save(get_model_state_dict(model), checkpoint_id=str(folder / name))
        for name, (optimizer, model) in self.optimizers.items():
            dcp.save(get_optimizer_state_dict(model, optimizer), checkpoint_id=str(folder / name))

    def load_optimizers(self, checkpoint: Path) -> None:
        """Every rank reads its shards of each optimizer's state from a checkpoint (a collective)."""
        for name, (optimizer, model) in self.optimizers.items():
            load_sharded_optimizer(model, optimizer, Path(checkpoint) / SHARDED / name)


def load_sharded_model(model, folder: str | Path) -> None:
    """Read a sharded model's weights (written by :meth:`ShardedParts.save`) into ``model``, sharded
    the same way or not (a collective when it is sharded)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

    _check(folder)
    state = get_model_state_dict(model)
    dcp.load(state, checkpoint_id=str(folder))
    set_model_state_dict(model, state)


def load_sharded_optimizer(model, optimizer: torch.optim.Optimizer, folder: str | Path) -> None:
    """Read an optimizer's state (written by :meth:`ShardedParts.save`) into ``optimizer`` over ``model``."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

    _check(folder)
    state = get_optimizer_state_dict(model, optimizer)  # every state tensor, initialised, as the target
    dcp.load(state, checkpoint_id=str(folder))
    set_optimizer_state_dict(model, optimizer, state)


def _check(folder: str | Path) -> None:
    if not (Path(folder) / ".metadata").is_file():
        from rlvr.run.folder import RunFolderError

        raise RunFolderError(f"{folder}: no sharded checkpoint here (no .metadata); the checkpoint was written by "
                             "another recipe or is damaged; start the run again with --overwrite")
