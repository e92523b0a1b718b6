"""One benchmark per (backend, d_model, T, component): layernorm, masked softmax, the
attention core, the attention and FFN sublayers and the whole block (tblock.backends.components).

Grouped by component and size, so each pytest-benchmark table compares the backends on
the same work; ``--benchmark-group-by=param:case`` or the JSON's extra_info regroup it.
"""

import pytest


def test_component(benchmark, case, component_sets, inputs_for, measure_case):
    cs = component_sets(case.backend, case.d_model, case.n_heads)
    if not cs.available(case.component):
        pytest.skip(f"{case.id}: n/a, {cs.missing[case.component]}")
    measure_case(benchmark, case, cs, inputs_for(case.d_model, case.n_heads, case.T)[case.component])
