"""Where the samplers' random draws come from: one generator for the batch, or one generator per row.

The reference draws one stream over the whole `(batch, ...)` tensor, so a row's draws depend on
what it is batched with. `RowGenerators` gives each row its own seeded generator and draws, per
row, only over that row's own positions (left padding is skipped), in the order a solo decode of
the row draws them: a seeded sampled row decodes the same alone or in any batch. Every draw goes
through `uniform`, which takes either kind.
"""

from __future__ import annotations

import torch


class RowGenerators:
    """One generator per row, seeded by `seeds[row]`; `pads[row]` left-padding positions are not drawn for.

    `at(lo, live)` is the view for one step's window of canvas positions starting at `lo` (dim 1 of a
    draw's shape), where only the `live` rows draw: a row whose block is already finished waits for
    the batch's other rows without drawing, as it would not have stepped there alone. A draw without
    a position dimension (an autoregressive step's `(batch, vocab)`) passes `pads` of 0.
    """

    def __init__(
        self,
        seeds: list[int],
        pads: list[int],
        device: torch.device,
        lo: int = 0,
        live: list[bool] | None = None,
        generators: list[torch.Generator] | None = None,
    ):
        if len(seeds) != len(pads):
            raise ValueError(f"RowGenerators: {len(seeds)} seeds for {len(pads)} rows")
        self.seeds, self.pads, self.lo = list(seeds), list(pads), lo
        self.live = live if live is not None else [True] * len(seeds)
        self.generators = generators or [torch.Generator(device=device).manual_seed(s) for s in seeds]

    def at(self, lo: int, live: list[bool] | None = None) -> RowGenerators:
        return RowGenerators(self.seeds, self.pads, torch.device("cpu"), lo, live, self.generators)

    def rand(self, shape: tuple[int, ...], dtype: torch.dtype | None, device: torch.device) -> torch.Tensor:
        if shape[0] != len(self.generators):
            raise ValueError(f"RowGenerators: a draw of shape {tuple(shape)} for {len(self.generators)} rows")
        out = torch.full(shape, 0.5, dtype=dtype, device=device)  # padding: any value in (0, 1), never read
        for row, generator in enumerate(self.generators):
            if not self.live[row]:
                continue
            skip = max(0, self.pads[row] - self.lo) if len(shape) > 1 else 0
            out[row, skip:] = torch.rand(
                (shape[1] - skip, *shape[2:]) if len(shape) > 1 else (), dtype=dtype, device=device, generator=generator
            )
        return out


Draws = torch.Generator | RowGenerators | None  # a step's random stream: one generator, one per row, or torch's own


def left_pads(attention_mask: torch.Tensor | None, batch: int) -> list[int]:
    """Left-padding positions per row of a `(batch, prompt_len)` mask (0 where padded); zeros without one."""
    if attention_mask is None:
        return [0] * batch
    return (attention_mask == 0).long().cumprod(dim=1).sum(dim=1).tolist()


def uniform(
    shape: tuple[int, ...],
    dtype: torch.dtype | None,
    device: torch.device,
    generator: torch.Generator | RowGenerators | None,
) -> torch.Tensor:
    """U[0, 1) draws of `shape` from `generator` (None: torch's global RNG); dtype None: torch's default."""
    if isinstance(generator, RowGenerators):
        return generator.rand(tuple(shape), dtype, device)
    return torch.rand(shape, dtype=dtype, device=device, generator=generator)


def draw_streams(where: torch.Tensor, generator: Draws) -> list[tuple[torch.Tensor, torch.Generator | None]]:
    """The positions of `where` `(batch, seq)` grouped by the stream that draws for them, in drawing order: all of
    them for one generator (row-major, as Dream draws over `x[mask_index]`), each live row's own for RowGenerators."""
    if not isinstance(generator, RowGenerators):
        return [(where, generator)]
    rows = torch.arange(where.shape[0], device=where.device)[:, None]  # (B, 1)
    return [(where & (rows == r), g) for r, g in enumerate(generator.generators) if generator.live[r]]


def uniform_at(where: torch.Tensor, generator: Draws) -> torch.Tensor:
    """`(batch, seq)`: one U[0, 1) draw (torch's default dtype) per position of `where`, each stream drawing
    `torch.rand(n)` over its n positions in row-major order (`draw_streams`); 1.0 elsewhere."""
    u = torch.ones(where.shape, device=where.device)
    for part, g in draw_streams(where, generator):
        u[part] = torch.rand(int(part.sum()), device=where.device, generator=g)
    return u
