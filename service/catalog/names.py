"""A catalog entry by the name a user writes: its slug, its published name in any case and spacing
("H100 SXM5 80GB", "Llama-3.1-8B"), a Hugging Face repo id ("meta-llama/Llama-3.1-8B"), or words
that only one entry carries ("4090", "mi300x"). Words that several carry ("h100", "a100-80gb") are
refused, naming those entries: the catalog does not pick a memory size or form factor for the user.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping

from service.catalog.errors import CatalogKind, UnknownCatalogEntry

# Words that tell no entry apart: vendors' names in their product names, and the "-hf" of the
# Hugging Face repos that hold a converted checkpoint (meta-llama/Llama-2-7b-hf).
VENDOR_WORDS = frozenset({"nvidia", "amd", "instinct", "geforce", "tesla", "hf"})
# Longer than any name an entry is written by (repo ids, published names): refused unread, so that a
# request's work on names is bounded by their count
MAX_NAME_CHARS = 200


def normalised(name: str) -> str:
    """Lower case, runs of spaces and underscores as one hyphen: "H100 SXM5_80GB" -> "h100-sxm5-80gb"."""
    return re.sub(r"[\s_]+", "-", name.strip().lower())


def words(name: str) -> frozenset[str]:
    """The words of a name, split at anything but letters, digits and dots, without vendor words:
    "NVIDIA H100 SXM5 96GB, 500 W" -> {"h100", "sxm5", "96gb", "500", "w"}."""
    return frozenset(re.split(r"[^a-z0-9.]+", name.strip().lower())) - VENDOR_WORDS - {""}


def resolve(
    kind: CatalogKind,
    name: str,
    aliases: Mapping[str, Iterable[str]],
    must_name: re.Pattern[str] | None = None,
) -> str:
    """The slug of the entry ``name`` names, by ``aliases`` (slug -> its other names: published name,
    repo id), in this order: the slug itself; one entry whose slug or alias is ``name`` up to case,
    spaces and underscores; one entry that carries every word of ``name`` where ``name`` also has
    every word of its slug that ``must_name`` matches (a model's size: "mixtral" alone is not read as
    mixtral-8x7b). Else UnknownCatalogEntry, with the entries that carry its words (several: it is
    ambiguous) or the closest slugs."""
    if name in aliases:
        return name
    if len(name) > MAX_NAME_CHARS:  # longer than any entry's name: not matched word by word (bounded work)
        raise UnknownCatalogEntry(kind, name, aliases)
    wanted = normalised(name)
    same = sorted(slug for slug, other in aliases.items() if wanted in map(normalised, (slug, *other)))
    if len(same) == 1:
        return same[0]
    query = words(name)
    carrying = same or sorted(
        slug
        for slug, other in aliases.items()
        if query and query <= frozenset().union(*map(words, (slug, *other)))
    )
    if len(carrying) == 1 and query >= _named_words(carrying[0], must_name):
        return carrying[0]
    if carrying:
        raise UnknownCatalogEntry(kind, name, aliases, candidates=carrying, ambiguous=len(carrying) > 1)
    close = difflib.get_close_matches(wanted, list(aliases), n=3, cutoff=0.6)
    raise UnknownCatalogEntry(kind, name, aliases, candidates=close)


def _named_words(slug: str, must_name: re.Pattern[str] | None) -> frozenset[str]:
    """The words of ``slug`` a name must state to select it by its words."""
    return frozenset() if must_name is None else frozenset(w for w in words(slug) if must_name.match(w))
