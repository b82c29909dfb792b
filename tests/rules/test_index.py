"""Rule family :mod:`irkit.rules.index`: a slice of ``GatherElements`` is the gather of the sliced
indices (numbers unchanged); a gather whose whole result is read elsewhere stays."""

from __future__ import annotations

from tests.rules.support import fire, no_fire, parse

_GATHER = (
    "g (float[2, 6, 7] d, int64[2, 6, 4] i) => (float[2, 6, 3] y{extra}) {{\n"
    "  s = Constant<value=int64[1] {{1}}>()  e = Constant<value=int64[1] {{9223372036854775807}}>()\n"
    "  a = Constant<value=int64[1] {{-1}}>()  gathered = GatherElements<axis=-1>(d, i)\n"
    "  y = Slice(gathered, s, e, a)\n}}"
)


def test_slice_of_gather_elements_slices_the_indices():
    m = parse(_GATHER.format(extra=""))
    fire(m, "SliceOfGatherElements", {"Constant": 3, "GatherElements": 1, "Slice": 1})
    (gather,) = [n for n in m.graph if n.op_type == "GatherElements"]
    assert gather.inputs[1].producer().op_type == "Slice"


def test_a_gather_read_whole_elsewhere_stays():
    text = _GATHER.format(extra=", float[2, 6, 4] gathered")
    no_fire(
        parse(text), "SliceOfGatherElements", "an intermediate value of the match is a graph output"
    )
