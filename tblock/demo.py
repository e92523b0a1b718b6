"""tblock.demo is tblock.lesson.demo, under the name it has always had."""

import sys

from .lesson import demo

sys.modules[__name__] = demo
