"""Metrics against hand-computed values; each case names the normalisation rule it exercises."""

import pytest

from mm_ds.eval.metrics import (accuracy, exact_match, f1, mlqa_normalize, mlqa_punctuation, normalizer, qa_scores,
                                squad_normalize)

SQUAD = squad_normalize


# ------------------------------------------------------------------------------------- SQuAD v1.1


@pytest.mark.parametrize("text, expected", [
    # lower -> "the denver broncos!" -> drop "!" -> article "the" to space -> collapse whitespace
    ("The Denver Broncos!", "denver broncos"),
    # articles only as whole words: "theatre", "another", "apple" keep their a/an/the
    ("Theatre and another apple", "theatre and another apple"),
    # punctuation is deleted, not replaced by a space, before articles: "A-team" -> "ateam"
    ("A-team", "ateam"),
    # only the 32 ASCII marks go: « » ¿ stay, "," and "?" go
    ("«Hola», ¿qué?", "«hola» ¿qué"),
    # CJK punctuation is not ASCII: 。and ， stay
    ("他说，你好。", "他说，你好。"),
    # tabs/newlines collapse to single spaces
    ("  an\tapple \n pie ", "apple pie"),
])
def test_squad_normalize(text, expected):
    assert squad_normalize(text) == expected


def test_squad_em_f1_by_hand():
    # pred tokens [denver, broncos, team], gold [denver, broncos]: P=2/3, R=1, F1=2*(2/3)/(5/3)=0.8
    assert f1("the Denver Broncos team", "Denver Broncos", SQUAD) == pytest.approx(0.8)
    assert exact_match("the Denver Broncos team", "Denver Broncos", SQUAD) == 0.0
    assert exact_match("Denver Broncos.", "the denver broncos", SQUAD) == 1.0
    # empty prediction: no common token -> 0 / 0
    assert f1("", "Denver", SQUAD) == 0.0 and exact_match("", "Denver", SQUAD) == 0.0
    # gold that normalises to nothing: EM 1 against "" but F1 0 (official quirk)
    assert exact_match("", "The", SQUAD) == 1.0 and f1("", "The", SQUAD) == 0.0
    # repeated tokens count with multiplicity: pred [a1, a1] vs gold [a1]: same=1, P=1/2, R=1 -> 2/3
    assert f1("x x", "x", SQUAD) == pytest.approx(2 / 3)


def test_qa_scores_max_over_golds_missing_and_unknown():
    golds = {"q1": ["Denver Broncos"], "q2": ["Carolina Panthers", "Panthers"], "q3": ["Santa Clara"]}
    preds = {"q1": "Denver Broncos", "q2": "the Panthers team", "q4": "stray"}
    # q1: EM 1, F1 1.
    # q2: [panthers, team] vs [carolina, panthers]: P=1/2 R=1/2 F1=1/2; vs [panthers]: P=1/2 R=1 F1=2/3 -> 2/3
    # q3: missing -> 0. EM = 100*1/3, F1 = 100*(1+2/3)/3 = 55.55...; q4 is unknown and ignored
    out = qa_scores(golds, preds, SQUAD)
    assert out["exact_match"] == pytest.approx(100 / 3)
    assert out["f1"] == pytest.approx(500 / 9)
    assert (out["count"], out["missing"], out["unknown"]) == (3, 1, 1)


def test_qa_scores_multiple_golds_f1():
    # "the Broncos of Denver" -> [broncos, of, denver]; vs [denver, broncos] F1 0.8; vs [broncos] F1 0.5
    out = qa_scores({"q": ["Denver Broncos", "Broncos"]}, {"q": "the Broncos of Denver"}, SQUAD)
    assert out["f1"] == pytest.approx(80.0) and out["exact_match"] == 0.0


# ------------------------------------------------------------------------------------------- MLQA


def test_mlqa_punctuation_set():
    p = mlqa_punctuation()
    assert {"«", "»", "¿", "。", "，", "،", "؟", "।", "“", "—"} <= p  # Unicode P*
    assert {"$", "+", "<", "=", ">", "^", "`", "|", "~"} <= p  # ASCII symbols (S*) from string.punctuation
    assert "€" not in p and "°" not in p  # other symbols stay


@pytest.mark.parametrize("lang, text, expected", [
    # en: Unicode « » removed (SQuAD would keep them), then "the" -> space
    ("en", "The «Great» Gatsby!", "great gatsby"),
    ("en", "Theatre another", "theatre another"),  # whole words only
    # es: ¿ ? removed; "la", "los" are articles, "lasañas" is not
    ("es", "¿Dónde está la casa de los Pérez?", "dónde está casa de pérez"),
    ("es", "Las lasañas", "lasañas"),
    # de: die/des are articles, Dieser/Dessert are not; SQuAD's English list would keep "die"
    ("de", "Die Zerstörung des Dorfes", "zerstörung dorfes"),
    ("de", "Dieser Dessert", "dieser dessert"),
    # vi: "cái", "của", "là" are removed as whole words; "làm" stays
    ("vi", "Cái bàn của tôi", "bàn tôi"),
    ("vi", "Là người làm", "người làm"),
    # ar: EVERY "ال" becomes a space, word-initial or not: "قال" -> "ق", "الرجل" -> "رجل"; "،" removed
    ("ar", "قال، الرجل", "ق رجل"),
    ("ar", "الكتاب", "كتاب"),
    # hi: no articles (English "the" stays), danda "।" removed
    ("hi", "the भारत की राजधानी।", "the भारत की राजधानी"),
    # zh: each basic-block Han char is a token, Latin/digit runs stay whole, 。 removed
    ("zh", "苹果公司的iPhone 12手机。", "苹 果 公 司 的 iphone 12 手 机"),
    # zh: 〇 (U+3007) is outside [\u4e00-\u9fa5], so "〇〇" is one run-token
    ("zh", "二〇〇八年", "二 〇〇 八 年"),
    ("zh", "the apple", "the apple"),  # no articles for zh
])
def test_mlqa_normalize(lang, text, expected):
    assert mlqa_normalize(text, lang) == expected


def test_mlqa_vs_squad_f1_by_hand():
    zh = normalizer("mlqa", "zh")
    # pred [iphone, 12, 手, 机] (4) vs gold [苹,果,公,司,的,iphone,12,手,机] (9): same 4, P=1, R=4/9
    # F1 = 2*(4/9)/(13/9) = 8/13
    assert f1("iPhone 12手机", "苹果公司的iPhone 12手机。", zh) == pytest.approx(8 / 13)
    # SQuAD splits on spaces only: [iphone, 12手机] vs [苹果公司的iphone, 12手机。] share nothing
    assert f1("iPhone 12手机", "苹果公司的iPhone 12手机。", SQUAD) == 0.0
    ar = normalizer("mlqa", "ar")
    # [ق, رجل] vs [رجل]: P=1/2 R=1 -> 2/3; "كتاب" matches "الكتاب" exactly after the ال rule
    assert f1("قال الرجل", "الرجل", ar) == pytest.approx(2 / 3)
    assert exact_match("كتاب", "الكتاب", ar) == 1.0 and exact_match("كتاب", "الكتاب", SQUAD) == 0.0
    es = normalizer("mlqa", "es")
    # «La casa» vs "casa": both normalise to "casa" under MLQA-es; SQuAD keeps «» and "la"
    assert exact_match("«La casa»", "casa", es) == 1.0 and exact_match("«La casa»", "casa", SQUAD) == 0.0


def test_mlqa_unknown_language_is_an_error():
    with pytest.raises(ValueError, match="'fr'"):
        mlqa_normalize("x", "fr")
    with pytest.raises(ValueError, match="'fr'"):
        normalizer("mlqa", "fr")
    with pytest.raises(ValueError, match="'bleu'"):
        normalizer("bleu", "en")


def test_accuracy():
    assert accuracy([0, 1, 2, 1], [0, 1, 1, 1]) == 75.0
    with pytest.raises(ValueError):
        accuracy([0], [0, 1])
