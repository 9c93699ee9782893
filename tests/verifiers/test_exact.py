from verifiers import exact


def test_gold_scores_one_and_wrong_scores_zero():
    spec = {"answer": "Paris"}
    gold = exact.verify(spec, exact.gold_completion(spec))
    assert (gold.reward, gold.passed, gold.status) == (1.0, True, "ok")
    wrong = exact.verify(spec, "Lyon")
    assert (wrong.reward, wrong.passed, wrong.status) == (0.0, False, "wrong")


def test_normalisation_forgives_case_width_spacing_and_trailing_punctuation():
    spec = {"answer": "New  York City"}
    for completion in ["new york city.", "  NEW YORK\tCITY!  ", "ＮＥＷ ＹＯＲＫ ＣＩＴＹ"]:
        assert exact.verify(spec, completion).passed, completion
    assert not exact.verify(spec, "New York").passed
    assert not exact.verify({"answer": "3.5"}, "35").passed


def test_list_of_answers_and_bad_specs():
    assert exact.verify({"answer": ["colour", "color"]}, "Color").passed
    assert exact.verify({"answer": 3}, "3").passed  # a JSON number is its JSON text, as ingest accepts it
    assert exact.verify({"answer": True}, "true").status == "format_error"
    assert exact.verify({"answer": []}, "x").status == "format_error"
    assert exact.verify({"answer": "x"}, "   ").status == "format_error"
