"""The generated multilingual world: the project's embedded default data (no third-party text, no network).

A seeded grammar draws English-like sentences from semantic events (agent, patient, verb, tense, voice,
number, animacy; grammar.py). Target languages render the same events with other word orders and
generated word forms (languages.py), so their task sets are exact translations. Tasks whose labels
depend on who the agent is (tasks.py) are written in the official formats the task loaders read
(writer.py). `mm-ds world --out world --langs t1,t2 --seed 0` or `generate_world("world")`.

Layout (paths match the first pattern of each task in mm_ds/data/tasks.py):

    world/
      world.json                          seed, language presets, sizes, overlap with English per language
      text/en.txt text/t1.txt ...         raw text, one sentence per line, blank line between documents
      lexicon/en.tsv lexicon/t1.tsv ...   English form -> form in the language (an oracle word map)
      mnli/multinli_1.0_train.jsonl       NLI train, English, {"gold_label","sentence1","sentence2",...}
      xnli/xnli.{dev,test}.{lang}.tsv     language gold_label sentence1 sentence2 genre pairID
      paws-x/train.en.tsv                 id sentence1 sentence2 label
      paws-x/{dev,test}.{lang}.tsv
      squad/train-v1.1.json squad/dev-v1.1.json                 SQuAD v1.1 JSON, English
      mlqa/{dev,test}-context-{lang}-question-{lang}.json       SQuAD v1.1 JSON, every language
      xquad/xquad.{lang}.json                                   = the QA test split, every language

{lang} is en and every target language; dev/test items (ids, labels) are the same in every language.
Language presets (languages.PRESETS): t1 renamed words in English order; t2 t1's words, verb-final with
nominative and accusative particles (Japanese- or Korean-like), postpositions, subordinate clause first, the
passive's auxiliary second; t3 Cyrillic script, verb-final without case, noun-adjective, only numbers and
punctuation shared; t4 Greek script, verb-initial, noun-adjective.
"""

from .grammar import LEXICON, NP, Event, Sampler
from .languages import ENGLISH, PRESETS, Language, Renderer, build_wordmap, get_language
from .tasks import nli_label, paws_label
from .writer import DEFAULT_TASK_SIZES, generate_world, main, write_heldout

__all__ = ["LEXICON", "NP", "Event", "Sampler", "ENGLISH", "PRESETS", "Language", "Renderer", "build_wordmap",
           "get_language", "nli_label", "paws_label", "DEFAULT_TASK_SIZES", "generate_world", "main",
           "write_heldout"]
