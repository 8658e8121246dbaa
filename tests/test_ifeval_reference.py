"""IFEval's reference test cases (google-research instruction_following_eval/instructions_test.py, Apache-2.0),
ported case by case: our checkers must give the reference's answer on each. The reference's tests of
instructions outside IFEval's 25 (constrained start, rephrasing, key sentences) are left out."""

import pytest

from sbon.ifeval.checkers import CHECKERS, build

BULLETS_1 = """
  A Markdown bullet point is a way of formatting text to create a list. To
  create a bullet point, start each line with an asterisk (*). For example:
  * This is a bullet point.
  *(no space required)Another bullet point.
  * (no newline ending required)Another bullet point.
  markdown bullet points are often used to create to-do lists or to list items
  in a step-by-step guide."""
BULLETS_2 = """
  Check that inline asterisk (*), *, will not be counted. Only * that starts a
  bullet list will be counted:
    * This is a bullet point.
    * Another bullet point.
    . dot is not counted"""
BULLETS_3 = """
  Here are three bullets starting with asterisk:
  * I am a large language model, also known as a conversational AI.
  * I am trained on a massive amount of text data, and I am able to communicate.
  * I am still under development, but I am learning new things every day."""
BULLETS_4 = """
  Here are three markdown bullets:
  - I am a large language model, also known as a conversational AI.
  - I am trained on a massive amount of text data, and I am able to communicate.
  -I am still under development, but I am learning new things every day."""
BULLETS_5 = """
  Paragraph 1
  ***
  Paragraph 2
  ***
  Paragraph 3
  * only one bullet point
  """
CONSTRAINED_3 = """
  My answer is no. I am still under development and I am always learning and
  improving. I am not the best chatbot in the world, but I am striving to be
  the best that I can be."""
HIGHLIGHT_1 = """
  To highlight text with Markdown, you can use the * character before and after
  the text you want to highlight. For example, if you want to highlight the
  word `hello`, you would type:*hello*, You can also use the ** character to
  create bold text. For example, if you want to bold the word `hello`, you
  would type: **hello** """
HIGHLIGHT_2 = """
  Sure, here are the numerical methods for solving partial differential
  equations highlighted with Markdown:
  *Finite difference methods
  *Finite element methods*
  *Boundary element methods
  *Monte Carlo methods
  I hope this helps!"""
HIGHLIGHT_3 = """
  There is allowed to be *two different* highlighted *sections in the same*
  line. **This is also true** for **double markdown highlights.**
  """
SECTION_1 = """
  Your response must have multiple sections. Mark the beginning of each section
  with "Section X", such as:
  Section 1
  [content of section 1]
  Section 2
  [content of section 2]"""
SECTION_2 = """SECTION 1
  [content of section 1]
  SECTION 2
  [content of section 2]"""
PARAGRAPH_1 = """
  paragraph 1
  ***
  paragraph 2
  ***
  paragraph 3"""
PARAGRAPH_2 = """
          ***
  paragraph 1
          ***
      paragraph 2
          ***
      paragraph 3"""
PARAGRAPH_3 = """
  paragraph 1
          ***
      paragraph 2
          ***
      paragraph 3
          ***"""
PARAGRAPH_4 = """
  paragraph 1
          ***
      paragraph 2
          ***
          ***"""
POSTSCRIPT_1 = """
  I will do my best to follow your instructions and always start my responses
  with "My response is:". I will try to be as consistent as possible, but
  please be patient with me if I make a mistake. I am still under development,
  and I am always learning new things.

  P.S. I hope this is what you were looking for."""
POSTSCRIPT_2 = """
  Sure, here is my response with a postscript starting with P.P.S.:

  My response is: I hope this answers your question.

  P.P.S. I am always happy to answer any other questions you may have.

  Do you have any other questions for me?"""
POSTSCRIPT_3 = """
  The radius of a unit circle is 1. However, I can give you a funny and wrong
  answer: the radius of a unit circle is 0. This is because a unit circle is a
  circle with a radius of 1, and if the radius is 0, then the circle has no
  size and is just a point. (not starting a new line) P.S. I hope you enjoyed
  my joke!"""
POSTSCRIPT_4 = """
  If the length of a square is one, the area of the square will also be one.
  p.p.s what if the entire response was lower case letters?
  """
POSTSCRIPT_5 = """
  The mysteries of space and time are mysterious.
  P. S. Sometimes there are even spaces between P. and S..
  """
KEYWORD_1 = """
  Paris is a city of beauty and romance. The romantic river Seine winds its way
  through the city, past iconic landmarks like the Eiffel Tower and the Louvre
  Museum, where the Mona Lisa resides. Whether you're taking a boat cruise down
  the river or simply strolling along the banks, you're sure to be captivated
  by the city's charm."""
KEYWORD_2 = """
  Paris is a city of beauty, romance, and history. It is home to some of the
  most iconic landmarks in the world, including the Eiffel Tower, the Louvre
  Museum, and the Notre Dame Cathedral. The city is also known for its romantic
  river cruises, its delicious food, and its stylish people.
  """
KEYWORDS = ["romantic", "river", "Mona Lisa"]
FREQUENCY_1 = """
  keyword, Keyword, KEYWORD
  """
FREQUENCY_2 = """
    *keyword
    *Keyword
    *KEYWORD
  """
WORDS_1 = """
  d3sCRi7 lArge lAnguagE M0del w1tH 20 w0RdS."""
WORDS_2 = """
  L4RGE L4NGU4GE M0DEL: AI syst3m th4t und3rstands, g3n3r4tes, or tr4nsforms
  l4ngu4g3 b4s3d on pr3vious l3arning & d4t4."""
FIRST_WORD_1 = """
  paragraph 1

  I paragraph 2

  paragraph 3"""
FIRST_WORD_2 = """
  paragraph 1

  I paragraph 2"""
FIRST_WORD_3 = """
  paragraph 1

  fail paragraph 2

  paragraph 3"""
FIRST_WORD_4 = """
  Wow this is a very long response.

  I can't believe there is more than three paragraphs.

  Really more than three? No way!

  I can't believe it but I guess I am living proof.

  Haha, you go that right."""
FIRST_WORD_5 = """
  Wow this is a very long response.

  I can't believe there is more than three paragraphs.

  "Really?! more than three? No way!"

  I can't believe it but I guess I am living proof.

  Haha, you go that right."""
FIRST_WORD_6 = """
  Wow this is a very long response.

  I can't believe there is more than three paragraphs.

  Rea!lly more than three? No way!

  I can't believe it but I guess I am living proof.

  Haha, you go that right."""
FORBIDDEN_1 = """
  The Nazis came to power in 1933 through a combination of legal and illegal
  means. Hitler was appointed chancellor by President Paul von Hindenburg, and
  the Nazis quickly consolidated their power by passing a series of laws that
  restricted the rights of opposition parties and individuals. By 1934, Hitler
  had become dictator of Germany.
  """
FORBIDDEN_2 = """
  Dinosaurs were a diverse group of reptiles that dominated the Earth for over
  160 million years. They came in all shapes and sizes, from the tiny
  Compsognathus to the massive Argentinosaurus. Dinosaurs were the most
  successful land animals on Earth until they went extinct about 66 million
  years ago. The exact cause of their extinction is still unknown, but it
  is thought to have been a combination of factors, including an asteroid
  impact and climate change.
  """
FORBIDDEN_3 = """
  GPT, or Generative Pre-trained Transformer, is a family of neural network
  models that uses the transformer architecture. GPT models are trained on a
  massive dataset of text and code, and can be used for a variety of tasks,
  including text generation, translation, and question answering. GPT models
  have been shown to be very effective at these tasks, and are being used by
  a variety of companies and organizations like Google.
  """
TWO_1 = """
  This is response 1.
  ******
  This is response 2.
  """
TWO_2 = """
  This is response 1.
  ******
  This is response 1.
  """
TWO_3 = """
  This is response 1.
  ******
  This is response 2.
  ******
  This is response 3.
  """
TWO_4 = """
  ******
  Response 1.
  ******
  ******
  Response 2.
  ******
  """
TWO_5 = """
  ******
  Response 1
  ******
  Response 2
  ******
  """

C = "less than", "at least"
CASES = [
    ("language:response_language", {"language": "en"}, "The response is English", True),
    ("language:response_language", {"language": "es"}, "Desayunamos en McDonald's hoy", True),
    ("language:response_language", {"language": "en"}, "Today we visit the Louvre", True),
    ("length_constraints:number_sentences", {"relation": C[0], "num_sentences": 4}, "xx,x. xx,x! xx/x. x{x}x?", False),
    ("length_constraints:number_sentences", {"relation": C[0], "num_sentences": 5}, "xxxx. xx,x! xxxx. x(x)x?", True),
    ("length_constraints:number_sentences", {"relation": C[1], "num_sentences": 4}, "xxxx. xx,x! xx|x. x&x x?", True),
    ("length_constraints:number_sentences", {"relation": C[1], "num_sentences": 5}, "xx-x. xx,x! xx}x. x,xx?", False),
    ("detectable_content:number_placeholders", {"num_placeholders": 5},
     "Sure, here is a short template with 5 placeholders:\n[Name]\n[Email]\n[Phone]\n[Address]\n[Website]\n"
     "This template can be used for a variety of purposes, such ascreating a contact list, sending out surveys, "
     "or creating a sign-up form.", True),
    ("detectable_content:number_placeholders", {"num_placeholders": 7},
     "My [adjective] [noun] is [adjective] [noun]. I [verb] and [verb].", False),
    ("detectable_format:number_bullet_lists", {"num_bullets": 3}, BULLETS_1, True),
    ("detectable_format:number_bullet_lists", {"num_bullets": 2}, BULLETS_2, True),
    ("detectable_format:number_bullet_lists", {"num_bullets": 3}, BULLETS_3, True),
    ("detectable_format:number_bullet_lists", {"num_bullets": 3}, BULLETS_4, True),
    ("detectable_format:number_bullet_lists", {"num_bullets": 1}, BULLETS_5, True),
    ("detectable_format:constrained_response", {}, "\n My answer is no.\n", True),
    ("detectable_format:constrained_response", {}, "My answer is no.   ", True),
    ("detectable_format:constrained_response", {}, CONSTRAINED_3, True),
    ("detectable_format:number_highlighted_sections", {"num_highlights": 2}, HIGHLIGHT_1, True),
    ("detectable_format:number_highlighted_sections", {"num_highlights": 2}, HIGHLIGHT_2, False),
    ("detectable_format:number_highlighted_sections", {"num_highlights": 4}, HIGHLIGHT_3, True),
    ("detectable_format:multiple_sections", {"section_spliter": "Section", "num_sections": 3}, SECTION_1, False),
    ("detectable_format:multiple_sections", {"section_spliter": "SECTION", "num_sections": 2}, SECTION_2, True),
    ("length_constraints:number_paragraphs", {"num_paragraphs": 3}, PARAGRAPH_1, True),
    ("length_constraints:number_paragraphs", {"num_paragraphs": 3}, PARAGRAPH_2, True),
    ("length_constraints:number_paragraphs", {"num_paragraphs": 3}, PARAGRAPH_3, True),
    ("length_constraints:number_paragraphs", {"num_paragraphs": 2}, PARAGRAPH_4, False),
    ("detectable_content:postscript", {"postscript_marker": "P.S."}, POSTSCRIPT_1, True),
    ("detectable_content:postscript", {"postscript_marker": "PS:"}, POSTSCRIPT_1, False),
    ("detectable_content:postscript", {"postscript_marker": "P.P.S"}, POSTSCRIPT_2, True),
    ("detectable_content:postscript", {"postscript_marker": "P.S."}, POSTSCRIPT_3, True),
    ("detectable_content:postscript", {"postscript_marker": "P.P.S"}, POSTSCRIPT_4, True),
    ("detectable_content:postscript", {"postscript_marker": "P.S."}, POSTSCRIPT_5, True),
    ("keywords:existence", {"keywords": KEYWORDS}, KEYWORD_1, True),
    ("keywords:existence", {"keywords": KEYWORDS}, KEYWORD_2, False),
    ("keywords:frequency", {"keyword": "  keyword ", "frequency": 4, "relation": C[0]}, FREQUENCY_1, True),
    ("keywords:frequency", {"keyword": "  keyword ", "frequency": 3, "relation": C[1]}, FREQUENCY_1, True),
    ("keywords:frequency", {"keyword": "KEYWORD", "frequency": 4, "relation": C[1]}, FREQUENCY_2, False),
    ("length_constraints:number_words", {"num_words": 8, "relation": C[0]}, WORDS_1, True),
    ("length_constraints:number_words", {"num_words": 16, "relation": C[0]}, WORDS_2, False),
    ("length_constraints:number_words", {"num_words": 16, "relation": C[1]}, WORDS_2, True),
    *[("length_constraints:nth_paragraph_first_word", {"num_paragraphs": 3, "nth_paragraph": 2, "first_word": "I"},
       text, expected) for text, expected in [(FIRST_WORD_1, True), (FIRST_WORD_2, False), (FIRST_WORD_3, False)]],
    ("length_constraints:nth_paragraph_first_word", {"num_paragraphs": 5, "nth_paragraph": 5, "first_word": "haha"},
     FIRST_WORD_4, True),
    ("length_constraints:nth_paragraph_first_word", {"num_paragraphs": 5, "nth_paragraph": 3, "first_word": "Really"},
     FIRST_WORD_5, True),
    ("length_constraints:nth_paragraph_first_word", {"num_paragraphs": 5, "nth_paragraph": 3, "first_word": "Really"},
     FIRST_WORD_6, False),
    ("keywords:forbidden_words", {"forbidden_words": ["HOUSE", "POWER", "BECOME"]}, FORBIDDEN_1, False),
    ("keywords:forbidden_words", {"forbidden_words": ["HOUSE", "POWER", "BECOME"]}, FORBIDDEN_2, True),
    ("keywords:forbidden_words", {"forbidden_words": ["HOUSE", "POWER", "BECOME"]}, FORBIDDEN_3, True),
    ("keywords:forbidden_words", {"forbidden_words": ["GOOGLE", "TEXT"]}, FORBIDDEN_1, True),
    ("keywords:forbidden_words", {"forbidden_words": ["GOOGLE", "TEXT"]}, FORBIDDEN_2, True),
    ("keywords:forbidden_words", {"forbidden_words": ["GOOGLE", "TEXT"]}, FORBIDDEN_3, False),
    ("keywords:forbidden_words", {"forbidden_words": ["GENE", "TRANSFORM"]}, FORBIDDEN_3, True),
    ("combination:two_responses", {}, TWO_1, True),
    ("combination:two_responses", {}, TWO_2, False),
    ("combination:two_responses", {}, TWO_3, False),
    ("combination:two_responses", {}, TWO_4, False),
    ("combination:two_responses", {}, TWO_5, True),
    ("combination:repeat_prompt", {"prompt_to_repeat": "Write a CL description."},
     "Write a CL description. Hi, Le and TJ, please\n  check this out. Thanks.\n  ", True),
    ("combination:repeat_prompt", {"prompt_to_repeat": "Write a CL description."},
     "Hi, Le and TJ. Write a CL description. Thanks.\n  ", False),
    ("startend:end_checker", {"end_phrase": "\n  Any more questions?\n  "},
     "\n  The answer is 7. Any more questions?\n  ", True),
    ("startend:end_checker", {"end_phrase": "\n  This is the end.\n  "},
     "\n  At the end of this prompt I am required to say that this is the end.\n  ", True),
    ("startend:end_checker", {"end_phrase": "\n  This will fail.\n  "}, "\n  This will fail. Paris is cool.\n  ", False),
    ("detectable_format:title", {}, "\n  <<Song of Joy>>\n  La la la. Happy song.\n  ", True),
    ("detectable_format:title", {}, "\n  Is it fine for title to be at the end?\n  <<This is the title>>\n  ", True),
    ("detectable_format:title", {}, "\n  << >>\n  There is no title.\n  ", False),
    ("detectable_format:title", {}, "\n  <<This is not a title.\n  This is a paragraph.>>\n  ", False),
    ("keywords:letter_frequency", {"letter": "T", "let_frequency": 4, "let_relation": C[1]},
     "\n  There is the T. Four T's.\n  ", True),
    ("keywords:letter_frequency", {"letter": "a", "let_frequency": 4, "let_relation": C[0]},
     "\n  asdfghjkl!!aA\n  ", True),
    ("keywords:letter_frequency", {"letter": "p", "let_frequency": 4, "let_relation": C[1]},
     "\n  asdfghjkl!!aA\n  ", False),
    ("change_case:english_capital", {},
     "\n  THIS IS AN ENGLISH SENTENCE. EVERY LETTER IS CAPITALIZED!!! AMAZING.\n  ", True),
    ("change_case:english_capital", {}, "\n  Every Word Is Capitalized.\n  ", False),
    ("change_case:english_lowercase", {}, "\n  every letter is lowercase.\n  ", True),
    ("change_case:english_lowercase", {}, "\n  Almost every letter is lowercase.\n  ", False),
    ("punctuation:no_comma", {}, "\n  Every sentence is short. There is no need for a comma.\n  ", True),
    ("punctuation:no_comma", {}, "\n  Since the start of time, people have always found a way to punctuate.\n  ", False),
    ("change_case:capital_word_frequency", {"capital_frequency": 3, "capital_relation": C[1]},
     "\n  HERE there are THREE FUlly CAPITAL words.\n  ", True),
    ("change_case:capital_word_frequency", {"capital_frequency": 5, "capital_relation": C[0]},
     "\n  THERE are Four FULLY CAPITAL WORDS. Many Others Are Only Partially So.\n  ", True),
    ("change_case:capital_word_frequency", {"capital_frequency": 4, "capital_relation": C[0]},
     "\n  THERE are Four FULLY CAPITAL WORDS. Many Others Are Only Partially So.\n  ", False),
    ("startend:quotation", {}, '\n  "This entire message is wrapped in double quotation marks."\n  ', True),
    ("startend:quotation", {}, '\n  "This message is wrapped in double quotation marks." But not everything.\n  ', False),
    # The reference has no JSON case: two of ours, from its rule (strip ``` fences, then json.loads).
    ("detectable_format:json_format", {}, '```json\n{"a": [1, 2]}\n```', True),
    ("detectable_format:json_format", {}, 'Here is JSON: {"a": 1}', False),
]


@pytest.mark.parametrize("instruction_id,kwargs,response,expected", CASES,
                         ids=[f"{c[0].split(':')[1]}-{i}" for i, c in enumerate(CASES)])
def test_agrees_with_reference(instruction_id, kwargs, response, expected):
    assert build(instruction_id, kwargs).check(response) is expected


def test_every_instruction_type_has_a_reference_case():
    assert {c[0] for c in CASES} == set(CHECKERS)
    assert len(CHECKERS) == 25
