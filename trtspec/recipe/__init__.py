"""Recipes: one YAML file for a whole pipeline (schema), run stage by stage with stamps (run), gated against a
baseline (gate)."""

from trtspec.recipe.schema import Drafter, Recipe, command_lines, load_recipe, recipe_from_dict

__all__ = ["Drafter", "Recipe", "command_lines", "load_recipe", "recipe_from_dict"]
