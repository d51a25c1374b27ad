"""docs/layout.md's map of the library is the tree as it is: every module, named with the first
sentence of its docstring (`make layout-doc` writes it)."""

from __future__ import annotations

from tests.support.layout_doc import PACKAGES, PAGE, first_sentence, generated_map, page_with_map


def test_the_layout_page_maps_the_tree_as_it_is():
    page = PAGE.read_text()
    assert page_with_map(page) == page, "docs/layout.md is stale: run `make layout-doc`"


def test_every_module_appears_in_the_map(tmp_path):
    package = tmp_path / "art_core"
    package.mkdir()
    (package / "__init__.py").write_text('"""The client. More."""\n')
    (package / "_new_room.py").write_text('"""What the new room holds.\n\nDetails."""\n')
    for other in PACKAGES[1:]:
        (tmp_path / other).mkdir(parents=True)
    block = generated_map(tmp_path)
    assert "_new_room.py" in block and "What the new room holds" in block
    assert "Details" not in block


def test_first_sentence_stops_at_the_first_full_stop(tmp_path):
    module = tmp_path / "m.py"
    module.write_text('"""One thing: the map. The rest\nis detail."""\n')
    assert first_sentence(module) == "One thing: the map"
