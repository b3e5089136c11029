"""The one vocabulary of drafting methods: every name trtspec accepts for how tokens are drafted, with what each is.

The manifest records the method an engine was built for (`Method.built_into_engines`), a recipe names the drafter
it converts (`Method.recipe_drafters`), `generate` / `deploy` / `bench` / `tune` name the method a request runs
(`Method.decoded_on_cpu`). All of them read it from here.
"""

from __future__ import annotations

import enum


class Method(str, enum.Enum):
    NONE = "none"  # plain decoding
    MEDUSA = "medusa"  # Medusa heads built into the engine
    EAGLE = "eagle"  # an EAGLE draft in the engine, a static tree (EAGLE-1)
    EAGLE2 = "eagle2"  # the same draft, a dynamic tree (EAGLE-2)
    NGRAM = "ngram"  # prompt lookup and Token Recycling: no drafter
    SUFFIX = "suffix"  # suffix matches over the request, past outputs and a datastore: no drafter
    LOOKAHEAD = "lookahead"  # Jacobi guesses and an n-gram pool (W, N, G): no drafter
    HYBRID = "hybrid"  # the engine's Medusa / EAGLE drafter and suffix's candidates in one tree
    DRAFT_TARGET = "draft_target"  # a separate draft model (TensorRT-LLM hosts)
    REDRAFTER = "redrafter"  # Apple's recurrent drafter in the engine, beam search over its drafts

    @property
    def plain(self) -> bool:
        return self is Method.NONE

    @property
    def trained(self) -> bool:
        """A drafter trained for the base and built into the engine."""
        return self in (Method.MEDUSA, Method.EAGLE, Method.EAGLE2, Method.REDRAFTER)

    @property
    def training_free(self) -> bool:
        """Drafts with no drafter: any engine built with K >= 1 (lookahead: 2) runs it."""
        return self in (Method.NGRAM, Method.SUFFIX, Method.LOOKAHEAD)

    @classmethod
    def parse(cls, text: str) -> Method | None:
        """The method named `text`, or None when trtspec has no such name."""
        try:
            return cls(text)
        except ValueError:
            return None

    @classmethod
    def expect(cls, text: str, allowed: tuple[Method, ...], what: str) -> Method:
        """The method named `text` if it is one of `allowed`, else the user error naming `what` (a flag or a field)
        and the names allowed."""
        method = cls.parse(text)
        if method not in allowed:
            from trtspec.errors import ConfigError

            raise ConfigError(f"{what} {text!r} is not one of {', '.join(m.value for m in allowed)}")
        return method

    @classmethod
    def decoded_on_cpu(cls) -> tuple[Method, ...]:
        """What trtspec's CPU runtime decodes with, in the order commands list them (a draft model runs on
        TensorRT-LLM hosts only)."""
        return tuple(m for m in cls if m is not Method.DRAFT_TARGET)

    @classmethod
    def built_into_engines(cls) -> tuple[Method, ...]:
        """What an engine is built for (its manifest's method)."""
        return (Method.NONE, Method.MEDUSA, Method.EAGLE, Method.EAGLE2, Method.LOOKAHEAD, Method.DRAFT_TARGET,
                Method.REDRAFTER)

    @classmethod
    def recipe_drafters(cls) -> tuple[Method, ...]:
        """What a recipe's drafter section converts (EAGLE-2 is EAGLE's draft with a dynamic tree at build)."""
        return (Method.NONE, Method.MEDUSA, Method.EAGLE, Method.LOOKAHEAD, Method.DRAFT_TARGET, Method.REDRAFTER)


def names(methods) -> tuple[str, ...]:
    return tuple(m.value for m in methods)


METHODS = names(Method.decoded_on_cpu())
TRAINING_FREE = names(m for m in Method if m.training_free)
TRAINED = names(m for m in Method if m.trained)
PLAIN = Method.NONE.value
