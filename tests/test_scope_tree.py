"""``irkit._scope_tree``: the one module-call tree that outlining, the hierarchy guard and viz read."""

from __future__ import annotations

import onnx_ir as ir
import pytest

from irkit import metadata as md
from irkit._scope_tree import ScopeTree, common_scope
from irkit.errors import MetadataError

A = md.Frame("layers.0", 0, "m.Block")
A1 = md.Frame("layers.0", 1, "m.Block")
B = md.Frame("layers.0.attn", 0, "m.Attn")
C = md.Frame("layers.0.mlp", 0, "m.MLP")


def _node(name: str, *scope: md.Frame) -> ir.Node:
    node = ir.node("Relu", [], name=name)
    if scope:
        node.metadata_props[md.SCOPE] = md.encode_scope(scope)
    return node


def test_members_children_and_order():
    nodes = [_node("r0"), _node("b0", A, B), _node("a0", A), _node("c0", A, C), _node("x0", A1)]
    nodes.append(_node("b1", A, B))
    tree = ScopeTree(nodes)
    assert tree.children == {
        (): [(A,), (A1,)],
        (A,): [(A, B), (A, C)],
        (A, B): [],
        (A, C): [],
        (A1,): [],
    }
    assert {s: [n.name for n in ns] for s, ns in tree.members.items()} == {
        (): ["r0"],
        (A,): ["a0"],
        (A, B): ["b0", "b1"],
        (A, C): ["c0"],
        (A1,): ["x0"],
    }
    assert list(tree.calls()) == [(A,), (A, B), (A, C), (A1,)]  # (parents first)
    assert [n.name for n in tree.nodes((A,))] == ["a0", "b0", "b1", "c0"]
    assert list(tree.subtree(())) == [(), (A,), (A, B), (A, C), (A1,)]


def test_scopes_and_frames_are_interned():
    one, two = _node("1", A, B), _node("2", A, C)
    two.metadata_props[md.SCOPE] = md.encode_scope([md.Frame(*A), C])  # (an equal, new frame)
    tree = ScopeTree([one, two])
    assert tree.scope(one)[0] is tree.scope(two)[0]
    assert tree.scope(one) is tree.scope(_node("3", A, B))  # (one tuple per distinct scope)
    (key,) = [s for s in tree.members if s == (A,)]
    assert key[0] is tree.scope(one)[0]


def test_add_and_live_follow_rewrites():
    graph = ir.Graph([], [], nodes=[_node("b0", A, B), _node("c0", A, C)])
    tree = ScopeTree(graph)
    graph.remove(graph.node("b0"))
    replacement = _node("new", A, B)
    graph.append(replacement)
    tree.add([replacement])
    assert [n.name for n in tree.live((A,), graph)] == ["new", "c0"]
    assert [n.name for n in tree.nodes((A, B))] == ["b0", "new"]


def test_other_scope_readers_and_the_root():
    nodes = [_node("x"), _node("y")]
    tree = ScopeTree(nodes, scope_of=lambda n: (C,) if n.name == "y" else ())
    assert tree.children[()] == [(C,)] and [n.name for n in tree.members[()]] == ["x"]


def test_malformed_scope_names_the_node():
    bad = _node("bad")
    bad.metadata_props[md.SCOPE] = "[[1]]"
    with pytest.raises(MetadataError, match=r"^Node 'bad' \(Relu\) has malformed irkit.scope"):
        ScopeTree([bad])


@pytest.mark.parametrize(
    ("scopes", "expected"),
    [
        ([], None),
        ([()], ()),
        ([(A, B)], (A, B)),
        ([(A, B), (A, C)], (A,)),
        ([(A, B), (A,), (A, C)], (A,)),
        ([(A, B), (A1, B)], ()),
        ([(A, B), ()], ()),
        ([(A, B, C), (A, B, C)], (A, B, C)),
    ],
)
def test_common_scope(scopes, expected):
    assert common_scope(scopes) == expected
