"""Recipes: one YAML file for a whole pipeline (schema), run stage by stage with stamps (run), gated against a
baseline (gate)."""

from trtspec.lazy import lazy_exports
from trtspec.recipe.schema import Drafter, Recipe, command_lines, load_recipe, missing_paths, recipe_from_dict

__getattr__, _lazy = lazy_exports(__name__, {
    "RunOptions": "trtspec.recipe.run", "run_recipe": "trtspec.recipe.run", "dry_run_lines": "trtspec.recipe.run",
    "selected_stages": "trtspec.recipe.run",
    "check_target": "trtspec.recipe.tuned", "write_winner_recipe": "trtspec.recipe.tuned",
})
__all__ = ["Drafter", "Recipe", "command_lines", "load_recipe", "missing_paths", "recipe_from_dict", *_lazy]
