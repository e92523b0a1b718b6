"""Package data: Lesson 13's worked example (seed13_block.json)."""
