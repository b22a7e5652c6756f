"""Math answers a tester wrote blind (from the rules in README, without reading rewards.py), as a new user
would try them: (gold, the scored text of a completion, the reward), one comment naming each case's class.
tests/test_rewards.py scores them in the main thread and in a worker thread. On the first try 166 of 169 held; the
three misses were one class (a hedge inside the box's own sentence: '\boxed{45} (or 46 if ...)'), which
rewards.alone now states as a rule."""

FRESH = [
    # box_basic: box inside a closing sentence
    ("18", r"Therefore, the answer is $\boxed{18}$.", 1),
    # box_basic: bare box
    ("7", r"$\boxed{7}$", 1),
    # box_basic: box in prose, no dollar signs
    ("250", r"The total cost is \boxed{250}.", 1),
    # box_wrong: off by one
    ("18", r"Therefore, the answer is $\boxed{17}$.", -1),
    # box_wrong: swapped digits
    ("81", r"$\boxed{18}$", -1),

    # box_nested: double box
    ("14", r"$\boxed{\boxed{14}}$", 1),
    # box_nested: double box, decimal
    ("3.5", r"The final result is \boxed{\boxed{3.5}}.", 1),
    # box_nested: double box, wrong value
    ("14", r"$\boxed{\boxed{15}}$", -1),

    # box_multi_agree: two boxes with the same value
    ("9", r"Each friend gets $\boxed{9}$ stickers." "\n\n" r"Check: 27 / 3 = 9, so each friend indeed gets $\boxed{9}$.", 1),
    # box_marker_agree: box then a later marker with the same value
    ("18", r"The answer is $\boxed{18}$." "\n\n" r"Final answer: 18", 1),
    # box_multi_disagree: earlier box differs from last box
    ("15", r"First I got $\boxed{12}$, but after fixing the error the total is $\boxed{15}$.", -1),
    # box_multi_disagree: two boxes side by side
    ("8", r"$\boxed{7}$ and $\boxed{8}$", -1),

    # marker_answer_is: plain
    ("42", "The answer is 42.", 1),
    # marker_answer_is: with unit word
    ("125", "So the answer is 125 pages.", 1),
    # marker_answer_is: GSM8K few-shot prose style
    ("38", "Maya had 14 stickers. She bought 3 sheets of 8 stickers each, which is 24 stickers. 14 + 24 = 38. The answer is 38.", 1),
    # marker_answer_colon: plain
    ("64", "Answer: 64", 1),
    # marker_answer_colon: markdown bold marker
    ("19", "**Answer:** 19", 1),
    # marker_answer_colon: decimal with unit
    ("2.75", "Answer: 2.75 liters", 1),
    # marker_final_answer: plain
    ("310", "Final answer: 310", 1),
    # marker_final_answer: Minerva style closing sentence
    ("56", "Final Answer: The final answer is 56. I hope it is correct.", 1),
    # marker_hash: GSM8K reference style
    ("90", "Mark read 60/2 = 30 pages on Sunday.\nHe read 60+30 = 90 pages in total.\n#### 90", 1),
    # marker_hash: wrong value
    ("90", "Mark read 60/2 = 30 pages on Sunday.\nHe read 60+35 = 95 pages in total.\n#### 95", -1),

    # fallback_last_sentence: no box, no marker
    ("27", "Tom started with 35 marbles and gave away 8. So, Tom has 27 marbles now.", 1),
    # fallback_last_sentence: multi-line
    ("34", "There are 5 bags with 8 apples each, so 40 apples.\nShe eats 6 of them.\nShe has 34 apples left.", 1),
    # fallback_last_sentence: last sentence is an equation chain
    ("18", "Janet sells 16 - 3 - 4 = 9 eggs. She makes 9 * 2 = 18 dollars every day.", 1),
    # fallback_last_sentence: last digit sentence is not the answer
    ("34", "She has 34 apples left. That is 6 fewer than she had yesterday.", -1),
    # fallback_last_sentence: hedge in last sentence
    ("12", "So the class needs 12 or 13 tables.", -1),
    # no_answer: no number at all
    ("5", "I am not sure how to solve this problem.", -1),
    # no_answer: empty box
    ("5", r"$\boxed{}$", -1),

    # number_equivalence: 6.0 == 6
    ("6", r"\boxed{6.0}", 1),
    # number_equivalence: 0.50 == 0.5
    ("0.5", r"\boxed{0.50}", 1),
    # number_equivalence: slash fraction == decimal gold
    ("0.75", r"\boxed{3/4}", 1),
    # number_equivalence: \frac == decimal gold
    ("0.5", r"\boxed{\frac{1}{2}}", 1),
    # number_equivalence: \dfrac
    ("0.375", r"\boxed{\dfrac{3}{8}}", 1),
    # number_equivalence: \frac after a marker
    ("1.25", r"The answer is $\frac{5}{4}$.", 1),
    # number_equivalence: improper slash fraction
    ("2.5", r"\boxed{5/2}", 1),
    # number_equivalence: negative fraction
    ("-0.5", r"\boxed{-\frac{1}{2}}", 1),

    # exact_compare: 1/3 is not 0.33
    ("0.33", r"\boxed{\frac{1}{3}}", -1),
    # exact_compare: close but not equal
    ("6", r"\boxed{6.01}", -1),
    # exact_compare: inverted fraction
    ("2.5", r"\boxed{\frac{2}{5}}", -1),

    # unevaluated_arithmetic: division
    ("6", r"\boxed{18/3}", -1),
    # unevaluated_arithmetic: \cdot product
    ("20", r"\boxed{4 \cdot 5}", -1),
    # unevaluated_arithmetic: square root
    ("7", r"\boxed{\sqrt{49}}", -1),
    # unevaluated_arithmetic: factorial
    ("24", r"\boxed{4!}", -1),
    # unevaluated_arithmetic: integer-valued \dfrac
    ("5", r"\boxed{\dfrac{20}{4}}", -1),
    # unevaluated_arithmetic: \times
    ("40", r"\boxed{5 \times 8}", -1),
    # unevaluated_arithmetic: sum after marker
    ("15", "The answer is 7 + 8.", -1),

    # equation_chain: sum = result in box
    ("42", r"\boxed{15 + 27 = 42}", 1),
    # equation_chain: product = result after marker
    ("42", r"The answer is $6 \times 7 = 42$.", 1),
    # equation_chain: multi-step chain, last '=' decides
    ("14", r"\boxed{3 \times 4 + 2 = 12 + 2 = 14}", 1),
    # equation_chain: chain ends in wrong value
    ("42", r"\boxed{15 + 27 = 41}", -1),
    # equation_chain: last '=' gives unevaluated arithmetic
    ("42", r"\boxed{42 = 6 \times 7}", -1),

    # hedge_two_numbers: \text{ or } in box
    ("8", r"\boxed{8 \text{ or } 9}", -1),
    # hedge_two_numbers: French "ou"
    ("12", "La réponse est 12 ou 13.", -1),
    # hedge_two_numbers: German "oder"
    ("7", "Die Antwort ist 7 oder 8.", -1),
    # hedge_two_numbers: Russian "или"
    ("4", "Ответ: 4 или 5", -1),
    # hedge_two_numbers: Chinese "或"
    ("3", "答案是 3 或 4。", -1),
    # hedge_two_numbers: \sim between two numbers
    ("10", r"\boxed{10 \sim 12}", -1),
    # hedge_two_numbers: "vs." in box
    ("9", r"\boxed{9 \text{ vs. } 10}", -1),
    # hedge_two_numbers: "X, not Y"
    ("6", r"\boxed{6, \text{ not } 5}", -1),
    # hedge_two_numbers: parenthetical "(not Y)"
    ("40", "The answer is 40 (not 45).", -1),
    # hedge_two_numbers: comma list
    ("5", r"\boxed{5, 6}", -1),

    # range: en dash range
    ("5", r"\boxed{5–6}", -1),
    # range: hyphen range
    ("20", r"\boxed{20-25}", -1),
    # range: "between X and Y"
    ("3", "The answer is between 3 and 4 hours.", -1),
    # range: en dash range with unit after marker
    ("8", "Answer: 8–10 minutes", -1),

    # bound_approx: \approx in box
    ("42", r"\boxed{\approx 42}", -1),
    # bound_approx: "approximately"
    ("42", "The answer is approximately 42.", -1),
    # bound_approx: \geq in box
    ("10", r"\boxed{\geq 10}", -1),
    # bound_approx: "<" in box
    ("100", r"\boxed{< 100}", -1),
    # bound_approx: \text{about}
    ("30", r"\boxed{\text{about } 30}", -1),
    # bound_approx: "less than"
    ("20", "Final answer: less than 20", -1),
    # bound_approx: Unicode ≈
    ("3.14", "The answer is ≈ 3.14", -1),
    # bound_approx: "more than"
    ("50", "Answer: more than 50 people", -1),

    # time_ratio: clock time in box
    ("7", r"\boxed{7:15}", -1),
    # time_ratio: ratio in box
    ("3", r"\boxed{3:1}", -1),
    # time_ratio: ratio after marker
    ("2", "The ratio is 2:3. The answer is 2:3.", -1),
    # time_ratio: clock time with PM
    ("45", "The answer is 2:45 PM.", -1),

    # power: Unicode superscript, gold = value
    ("64", r"\boxed{2⁶}", -1),
    # power: caret power, gold = value
    ("1000", r"\boxed{10^3}", -1),
    # power: superscript after marker
    ("81", "The answer is 3⁴.", -1),
    # power: gold = base
    ("5", r"\boxed{5^2}", -1),

    # variable_term: coefficient times variable
    ("4", r"\boxed{4n}", -1),
    # variable_term: variable plus number
    ("7", r"\boxed{y+7}", -1),
    # variable_term: monomial with power
    ("5", r"\boxed{5x^2}", -1),
    # variable_term: linear expression after marker
    ("2", "The answer is 2t - 1.", -1),

    # restatement_after_answer: "maybe" after box
    ("12", r"$\boxed{12}$. Hmm, maybe 13.", -1),
    # restatement_after_answer: "Actually" after marker
    ("30", "The answer is 30. Actually, 32.", -1),
    # restatement_after_answer: parenthetical alternative after box
    ("45", r"\boxed{45} (or 46 if we count the teacher)", -1),
    # restatement_after_answer: "although" alternative after box
    ("7", r"\boxed{7}, although 8 is also possible.", -1),
    # restatement_after_answer: "Or" after final-answer marker
    ("100", "Final answer: 100. Or 120.", -1),

    # later_marker_conflict: box then final-answer marker with another value
    ("24", r"$\boxed{24}$" "\n\n" "Final answer: 26", -1),
    # later_marker_conflict: two "answer is" clauses, gold = first
    ("15", "The answer is 15.\n\nWait, let me recount the chairs.\nThe answer is 17.", -1),
    # later_marker_conflict: Answer: then ####
    ("9", "Answer: 9\n#### 10", -1),
    # later_marker_conflict: box then "The answer is"
    ("5", r"\boxed{5}" "\n" "The answer is 6.", -1),

    # unicode_minus: U+2212 minus sign
    ("-12", r"\boxed{" "\u2212" "12}", 1),
    # unicode_minus: U+2013 en dash after marker
    ("-7", "The answer is \u20137.", 1),
    # unicode_minus: U+FF0D fullwidth hyphen-minus
    ("-3", r"\boxed{" "\uff0d" "3}", 1),
    # unicode_minus: U+2010 hyphen
    ("-4", r"\boxed{" "\u2010" "4}", 1),
    # unicode_minus: U+2012 figure dash
    ("-9", r"\boxed{" "\u2012" "9}", 1),
    # unicode_minus: U+FE63 small hyphen-minus
    ("-2", r"\boxed{" "\ufe63" "2}", 1),
    # unicode_minus: U+2212 with degree sign in prose
    ("-8", "The temperature dropped to \u22128 degrees. So the answer is \u22128\u00b0.", 1),
    # unicode_minus: sign mismatch (negative answer, positive gold)
    ("12", r"\boxed{" "\u2212" "12}", -1),

    # nonascii_digits: Arabic-Indic
    ("36", r"\boxed{٣٦}", 1),
    # nonascii_digits: Extended Arabic-Indic (Persian)
    ("125", r"\boxed{۱۲۵}", 1),
    # nonascii_digits: Devanagari
    ("45", r"\boxed{४५}", 1),
    # nonascii_digits: fullwidth in box
    ("48", r"\boxed{４８}", 1),
    # nonascii_digits: fullwidth after marker
    ("7", "The answer is ７.", 1),
    # nonascii_digits: Arabic-Indic, wrong value
    ("42", r"\boxed{٤٣}", -1),

    # thousands_separator: comma
    ("1250", r"\boxed{1,250}", 1),
    # thousands_separator: {,}
    ("1250", r"\boxed{1{,}250}", 1),
    # thousands_separator: \,
    ("1250", r"\boxed{1\,250}", 1),
    # thousands_separator: \!
    ("1250", r"\boxed{1\!250}", 1),
    # thousands_separator: U+2009 thin space
    ("1250", r"\boxed{1" "\u2009" "250}", 1),
    # thousands_separator: U+202F narrow no-break space
    ("1250", r"\boxed{1" "\u202f" "250}", 1),
    # thousands_separator: \, in a $-wrapped box
    ("10000", r"$\boxed{10\,000}$", 1),
    # thousands_separator: comma number is not a different smaller gold
    ("125", r"\boxed{1,250}", -1),

    # gold_thousands_separator: gold 10{,}000 vs plain
    ("10{,}000", r"\boxed{10000}", 1),
    # gold_thousands_separator: gold {,} vs comma after marker
    ("1{,}500", "The answer is 1,500.", 1),
    # gold_thousands_separator: wrong magnitude
    ("10{,}000", r"\boxed{1000}", -1),

    # decimal: sentence-ending period after decimal
    ("3.5", "Answer: 3.5.", 1),
    # decimal: trailing zero with unit word, fallback sentence
    ("3.5", "Each ticket costs 3.50 dollars.", 1),

    # sci_notation: 1e3 == 1000
    ("1000", r"\boxed{1e3}", 1),
    # sci_notation: 2.5e2 after marker
    ("250", "The answer is 2.5e2.", 1),
    # sci_notation: negative exponent
    ("0.05", r"\boxed{5e-2}", 1),
    # sci_notation: mantissa equals gold but value does not
    ("2.5", r"\boxed{2.5e2}", -1),

    # scale_word: thousand in \text
    ("3000", r"\boxed{3 \text{ thousand}}", 1),
    # scale_word: million after marker
    ("2000000", "The answer is 2 million.", 1),
    # scale_word: dozen
    ("60", "Answer: 5 dozen", 1),
    # scale_word: decimal million
    ("1500000", "The city has 1.5 million residents. The answer is 1.5 million.", 1),
    # scale_word: gold = bare multiplier
    ("5", "Answer: 5 dozen", -1),
    # scale_word: gold = bare multiplier in box
    ("2", r"\boxed{2 \text{ million}}", -1),

    # units: km/h in \text
    ("60", r"\boxed{60 \text{ km/h}}", 1),
    # units: m/s^2 plain
    ("9.8", r"\boxed{9.8 m/s^2}", 1),
    # units: m^2
    ("24", r"\boxed{24 m^2}", 1),
    # units: m² superscript
    ("36", "The area is 36 m². The answer is 36 m².", 1),
    # units: percent
    ("15", r"\boxed{15\%}", 1),
    # units: Unicode degree after marker
    ("90", "The answer is 90°.", 1),
    # units: escaped dollar
    ("40", r"\boxed{\$40}", 1),
    # units: escaped dollar with comma thousands after marker
    ("1200", r"The answer is \$1,200.", 1),
    # units: "dollars"
    ("25", "The answer is 25 dollars.", 1),
    # units: \text{ cm}
    ("12", r"\boxed{12\text{ cm}}", 1),

    # marker_then_explanation: newline then explanation with other numbers
    ("18", "The answer is 18.\nShe bought 3 packs with 6 muffins in each pack.", 1),
    # marker_then_explanation: blank line then explanation
    ("42", "Answer: 42\n\nWe multiply the 6 rows by the 7 seats in each row.", 1),
    # marker_then_explanation: new sentence of explanation
    ("250", "Final answer: 250. Each of the 5 boxes holds 50 pencils.", 1),
    # marker_then_explanation: #### then explanation line
    ("64", "#### 64\nThe farmer started with 80 eggs and sold 16 of them.", 1),

    # box_then_long_check: verification paragraph with other numbers
    ("96", r"Each of the 8 shelves holds 12 books, so there are 8 \times 12 = 96 books." "\n\n" r"$\boxed{96}$" "\n\n"
           "Let me double-check this result. If there were 8 shelves with 10 books each, that would be 80 books. "
           "Adding 2 more books per shelf adds 8 x 2 = 16 books, and 80 + 16 = 96. Dividing 96 by 8 gives back 12 books "
           "per shelf, and dividing 96 by 12 gives back 8 shelves, so everything is consistent with the problem statement.", 1),
    # box_then_long_check: decimal answer then checks
    ("3.5", r"The rope is 14 meters long and is cut into 4 equal pieces, so each piece is \(14 \div 4 = 3.5\) meters." "\n\n" r"$\boxed{3.5}$" "\n\n"
            r"Verification: 4 pieces of 3.5 meters give \(4 \times 3.5 = 14\) meters, which matches the original length. "
            "If the pieces were 3 meters each, the total would be only 12 meters, and with 4 meters each it would be 16 meters. "
            "Converting to centimeters, each piece is 350 cm, and 4 times 350 cm is 1400 cm, which is again 14 meters.", 1),
    # box_then_long_check: box first, then a long sanity check
    ("150", r"$\boxed{150}$" "\n\n"
            "To double-check: the train covers 50 miles each hour for 3 hours. After the first hour it has gone 50 miles, "
            "after the second hour 100 miles, and after the third hour 150 miles. Using distance = speed x time we get "
            "50 x 3 = 150 miles as well. A sanity check with a rounder speed of 60 mph would give 180 miles, which is a bit "
            "more, as expected since the actual speed is lower.", 1),

    # symbolic_gold: \dfrac spelling
    (r"\frac{\sqrt{3}}{2}", r"\boxed{\dfrac{\sqrt{3}}{2}}", 1),
    # symbolic_gold: reordered product
    (r"\frac{\sqrt{3}}{2}", r"\boxed{\frac{1}{2}\sqrt{3}}", 1),
    # symbolic_gold: slash form after marker
    (r"\frac{\sqrt{3}}{2}", r"The answer is $\sqrt{3}/2$.", 1),
    # symbolic_gold: hedge with "or"
    (r"\frac{\sqrt{3}}{2}", r"\boxed{\frac{\sqrt{3}}{2} \text{ or } \frac{1}{2}}", -1),
    # symbolic_gold: interval, no space
    ("(0, 1]", r"\boxed{(0,1]}", 1),
    # symbolic_gold: interval with wrong endpoint type
    ("(0, 1]", r"\boxed{(0, 1)}", -1),
    # symbolic_gold: polynomial reordered
    ("x^2+1", r"\boxed{1 + x^2}", 1),
    # symbolic_gold: non-equivalent polynomial
    ("x^2+1", r"\boxed{(x+1)^2}", -1),
    # symbolic_gold: polynomial hedge with "or"
    ("x^2+1", r"\boxed{x^2 + 1 \text{ or } x^2 - 1}", -1),
    # symbolic_gold: pi fraction slash form
    (r"\frac{\pi}{4}", r"\boxed{\pi/4}", 1),

    # worked_solution: Qwen-style numbered steps, boxed
    ("42", r"To find how much Lena earns each day, let's break the problem into steps." "\n\n"
           r"1. **Eggs laid per day:** Lena's hens lay 22 eggs every day." "\n"
           r"2. **Eggs used:** She uses 5 eggs for omelets and 3 eggs for baking, so she uses \(5 + 3 = 8\) eggs." "\n"
           r"3. **Eggs left to sell:** \(22 - 8 = 14\) eggs." "\n"
           r"4. **Daily earnings:** She sells each egg for \$3, so she earns \(14 \times 3 = 42\) dollars." "\n\n"
           r"Therefore, the answer is $\boxed{42}$.", 1),
    # worked_solution: display math, box inside \( \)
    ("15", r"First, we find how many cupcakes were sold in the morning:" "\n"
           r"\[ 120 \times \frac{3}{4} = 90 \]" "\n"
           r"So \(120 - 90 = 30\) cupcakes remained." "\n"
           r"In the afternoon, half of the remaining cupcakes were sold:" "\n"
           r"\[ 30 \div 2 = 15 \]" "\n"
           r"Thus, the bakery has \(\boxed{15}\) cupcakes left at the end of the day.", 1),
    # worked_solution: same solution but hedges after the box
    ("15", r"First, we find how many cupcakes were sold in the morning:" "\n"
           r"\[ 120 \times \frac{3}{4} = 90 \]" "\n"
           r"So \(120 - 90 = 30\) cupcakes remained." "\n"
           r"In the afternoon, half of the remaining cupcakes were sold:" "\n"
           r"\[ 30 \div 2 = 15 \]" "\n"
           r"Thus, the bakery has \(\boxed{15}\) cupcakes left, or maybe 16.", -1),
    # worked_solution: correct work but unevaluated boxed fraction
    ("9", r"Liam has 27 marbles and shares them equally among 3 friends." "\n"
          r"Each friend gets \(\frac{27}{3}\) marbles." "\n"
          r"Therefore, the answer is $\boxed{\frac{27}{3}}$.", -1),
    # worked_solution: {,} thousands in box with unit word after
    ("1250", r"The school sold 250 tickets at \$5 each." "\n"
             r"Total revenue: \(250 \times 5 = 1{,}250\) dollars." "\n"
             r"So the school raised $\boxed{1{,}250}$ dollars.", 1),
    # worked_solution: intermediate box disagrees with final box
    ("24", r"Sara had 12 pencils and her mother gave her 8 more, so she has \(12 + 8 = 20\) pencils, i.e. $\boxed{20}$." "\n"
           r"Then she bought 4 more at the store, so she has \(20 + 4 = 24\) pencils." "\n"
           r"Therefore, the answer is $\boxed{24}$.", -1),
    # worked_solution: probability as boxed fraction vs decimal gold
    ("0.25", r"There are 52 cards in a standard deck, and 13 of them are hearts." "\n"
             r"The probability of drawing a heart is" "\n"
             r"\[ P = \frac{13}{52} = \frac{1}{4} \]" "\n"
             r"Therefore, the answer is $\boxed{\frac{1}{4}}$.", 1),
    # worked_solution: boxed hedge at the end
    ("12", r"We need to seat 70 guests at tables that hold 6 people each." "\n"
           r"Since 11 tables hold only 66 people, 11 tables are not enough." "\n"
           r"Depending on whether the 2 hosts also need seats, the answer is $\boxed{12 \text{ or } 13}$.", -1),
    # worked_solution: algebra with negative boxed answer
    ("-6", r"We solve the equation \(3x + 20 = 2\)." "\n"
           r"Subtract 20 from both sides: \(3x = -18\)." "\n"
           r"Divide both sides by 3: \(x = -6\)." "\n"
           r"Therefore, the answer is $\boxed{-6}$.", 1),
    # worked_solution: prose marker answer then "Actually" correction
    ("38", "Maya had 14 stickers. She bought 3 sheets of 8 stickers each, which is 24 stickers. 14 + 24 = 38. The answer is 38. Actually, 36.", -1),
]


# Three classes an issue found refused or misread, each fixed by one rule of the grammar (docs/rewards.md): its
# own cases first, then fresh ones of the class, honest (+1) beside cheats (-1), rewards written by hand.

MARKUP = [  # emphasis and presentation around a number are read away; an operation or a hedge inside still counts
    ("72", "*72*", 1), ("72", "- **Total: 72**", 1), ("0.75", r"\boxed{\cfrac{3}{4}}", 1),
    ("42", r"\boxed{\boldsymbol{42}}", 1), ("42", r"\boxed{\underline{42}}", 1), ("42", r"\boxed{\texttt{42}}", 1),
    ("42", "Answer:\n```\n42\n```", 1),
    ("42", "Answer: *42*", 1), ("42", "*Answer*: __42__", 1), ("42", "The answer is ***42***.", 1),
    ("42", "Answer:\n~~~text\n42\n~~~", 1), ("42", r"\boxed{\textcolor{red}{42}}", 1), ("42", r"$\color{blue} 42$", 1),
    ("42", r"\boxed{\textbf{\underline{42}}}", 1), ("42", r"{\Large\bf 42}", 1), ("42", r"\boxed{\mathsf{42}}", 1),
    ("42", r"\boxed{\emph{42} \text{ seats}}", 1), ("1.5", r"\boxed{\tfrac{3}{2}}", 1), ("1.5", r"\boxed{\frac{\textbf{3}}{2}}", 1),
    ("42", r"\boxed{\bm{42}}", 1),
    ("42", "6*7", -1), ("64", "2**6", -1), ("42", "**6*7**", -1), ("42", "*42* or *43*", -1), ("42", "*6 * 7*", -1),
    ("42", "`6*7`", -1), ("42", "_42_ or _43_", -1), ("42", "**42** (maybe **43**)", -1), ("42", r"\boxed{\textbf{42 or 43}}", -1),
    ("42", r"\boxed{\underline{6 \times 7}}", -1), ("42", r"\boxed{\phantom{4}42}", -1), ("42", r"\boxed{\cancel{43} 42}", -1),
    ("1", r"\boxed{0.\overline{9}}", -1), ("42", "Answer:\n```\n42\n43\n```", -1), ("42", "Answer:\n```\nprint(6*7)\n```", -1),
    ("6", r"\boxed{\dfrac{12}{2}}", -1), ("42", r"\boxed{\textbf{\approx 42}}", -1), ("8", "2*3*4*", -1),
]

LISTS = [  # an enumerator at a line's start is list structure, not a number; the item's text is read as any line's
    ("42", "Answer: 42\n1. There are 6 rows.\n2. Each row has 7 seats.\n3. So 6 x 7 = 42 seats.", 1),
    ("42", "**Answer:** 42\n\n1) We count the 6 rows.\n2) Each row has 7 seats.", 1), ("42", "Answer: 42\n(1) there are 6 rows\n(2) of 7 seats each", 1),
    ("42", "The answer is 42.\nStep 1: there are 6 rows.\nStep 2: each has 7 seats.", 1),
    ("42", "1. There are 6 rows.\n2. Each has 7 seats.\n3. The total is 42.", 1),
    ("42", "Step 1: 6 rows.\nStep 2: 7 seats each.\nStep 3: 6 x 7 = 42 seats.", 1),
    ("42", "### Step 1: 6 rows\n### Step 2: 7 seats\n**Total: 42**", 1), ("42", "1. 42", 1),
    (r"42", "- 6 rows\n- 7 seats\n- so 42 seats", 1), ("42", r"\boxed{42}" "\n\n1. The hall has 6 rows.\n2. Each row holds 7 seats.", 1),
    ("42", "Answer: 42\n1. 6 rows\n2. 7 seats\n3. Answer: 43", -1), ("42", "Answer: 42\n1. 43", -1),
    ("42", "Answer: 42\n1. Or 43.", -1), ("42", r"\boxed{42}" "\n1. 6 rows\n2. maybe 43", -1),
    ("42", "1. 6 rows\n2. 7 seats\n3. 6 x 7", -1), ("42", "- 42", -1), ("-42", "- 42", -1),
    ("42", "The answer is 42.\n1) 43", -1), ("43", "1. 42\n2. 43 or 44", -1),
    # a line's number is a list's only as the next of its count (1, 2, 3): else it is a number of the text
    ("42", "Answer:\n42. Because 6 x 7 = 42.", 1), ("42", "Answer: 42\n43. That is final.", -1), ("42", "2. 42", -1),
]

LANGUAGES = [  # the word for 'answer' in the languages of math datasets, then ':', '=' or that language's 'is'
    ("12", "Die Antwort ist 12.\nEr hat also 12 Äpfel: 5 von Anna und 7 von Ben.", 1),
    ("12", "Die Antwort lautet 12. Er hatte 5 Äpfel und bekam 7 dazu.", 1),
    ("12", "Die endgültige Antwort ist 12.\n1. Er hat 5 Äpfel.\n2. Sie hat 7 Äpfel.", 1),
    ("12", "La réponse finale est 12.\nIl avait 5 pommes et en a reçu 7.", 1),
    ("12", "La respuesta es 12.\nTenía 5 manzanas y recibió 7 más.", 1),
    ("12", "A resposta é 12.\nEle tinha 5 maçãs e ganhou mais 7.", 1),
    ("12", "La risposta è 12.\nAveva 5 mele e ne ha ricevute 7.", 1),
    ("12", "Ответ: 12.\nУ него было 5 яблок, и он получил ещё 7.", 1), ("12", "答案是 12。他有 5 个苹果，又得到 7 个。", 1),
    ("12", "答えは12です。りんごが 5 個と 7 個あります。", 1), ("12", "答：12个。", 1),
    ("12", "最终答案为 12。他有 5 个，又买了 7 个。", 1),
    ("12", "Die Antwort ist 12 oder 13", -1), ("12", "Die Antwort ist 12.\nOder 13.", -1),
    ("12", "Die Antwort ist 12. Es könnte aber vielleicht auch 13 sein.", -1), ("12", "Die Antwort ist ungefähr 12.", -1),
    ("12", "Die Antwort ist nicht 12.", -1), ("12", "La réponse est 12. La réponse est 13.", -1),
    ("12", "La réponse est environ 12.", -1), ("12", "La respuesta es 12. Quizás 13.", -1),
    ("12", "A resposta é 12. Talvez 13.", -1), ("12", "La risposta è 12. Forse 13.", -1),
    ("12", "Ответ: примерно 12", -1), ("12", "Ответ: 12. Ответ: 13.", -1), ("12", "答案是 12。答案是 13。", -1),
    ("12", "答えは 12 または 13", -1), ("12", r"\boxed{12} oder 13", -1), ("12", "Die Antwort ist 6 + 6.", -1),
]



# Four classes issue 64 found misread, each fixed by one rule of the grammar (docs/rewards.md): every
# case was scored wrongly before its rule, but for PROMISES' four honest ones, which pin that the rule
# spares them.

TAGS = [  # R1's <answer> (<final_answer>, any tag named ...answer) is a box; any other tag is layout
    ("42", "<answer>42</answer>", 1), ("42", "<answer> 42 </answer>", 1),
    ("42", "<final_answer>42</final_answer>", 1), ("42", "<Answer>42 seats</Answer>", 1),
    ("0.75", r"<answer>\frac{3}{4}</answer>", 1),
    ("42", "There are 6 rows of 7 seats.\n<answer>42</answer>\nEvery seat is taken.", 1),
    ("42", "<answer><b>42</b></answer>", 1), ("42", "<b>42</b>", 1),
    ("42", "The answer is <strong>42</strong>.", 1), ("42", "<em>Answer:</em> 42", 1),
    ("42", "So the hall has <b>42</b> seats.", 1), ("42", "**Answer:** <em>42</em>", 1),
    ("42", r"\boxed{42} <answer>43</answer>", -1), ("42", r"<answer>43</answer> \boxed{42}", -1),
    ("42", "\\boxed{42}\n<final_answer>43</final_answer>", -1),
    ("42", r"\boxed{42}. <b>Actually 43.</b>", -1), ("42", r"\boxed{42}. <strong>Final: 43</strong>", -1),
    ("42", r"\boxed{42} and <answer>41</answer>", -1), ("42", r"\boxed{42}. <em>Actually, 41.</em>", -1),
]

COMPARATIVES = [  # a comparative right after the number states a difference; before it (or joined to
    # it by 'and') a bound
    ("3", "So she has 3 more apples than Tom.", 1), ("3", "The answer is 3 more.", 1),
    ("3", "Tom has 3 fewer marbles than Ann.", 1), ("3", "The answer is 3 less than before.", 1),
    ("3", "Ann ran 3 km more than Ben.", 1), ("12", "Ann read 12 pages more than Ben.", 1),
    ("4", "The answer is 4 years less.", 1), ("3", "Sie hat 3 Äpfel mehr.", 1),
    ("3", "Él tiene 3 manzanas más.", 1), ("3", "У него на 3 яблока больше.", 1),
    ("3", "The answer is above 3.", -1), ("3", "The answer is below 3.", -1), ("3", "beyond 3 km", -1),
    ("12", "The answer is 12 and above.", -1), ("12", "children 12 and below", -1),
    ("3", r"\boxed{\text{above } 3}", -1),
]

PUNCTUATION = [  # a prose '!' ends its sentence, a ratio's full stop or comma is the sentence's, a sign
    # before a currency symbol signs the amount, and sign words compose
    ("42", "The answer is 42!", 1), ("42", "She sold 42 apples!", 1), ("42", "She earned $42!", 1),
    ("42", "So she has 42 left! Great job.", 1), ("42", "Die Antwort ist 42!", 1),
    ("0.75", "The answer is 3/4.", 1), ("0.75", "Answer: 3/4, the share of the pie.", 1),
    ("0.75", "So each of them gets 3/4.", 1), ("-2/3", "The answer is -2/3.", 1),
    ("-5", "The answer is -$5.", 1), ("-5", r"He ends the week at -\$5.", 1),
    ("-1200", "The balance is -$1,200.", 1), ("-5", "The answer is \u2212$5.", 1),
    ("5", "minus minus 5", 1), ("5", "negative negative 5", 1),
    ("5", "The answer is minus negative 5.", 1), ("5", "Answer: negative minus 5", 1),
    ("-5", "minus minus 5", -1), ("-5", "negative negative 5", -1),
    ("-5", "The answer is minus negative 5.", -1), ("-5", "Answer: negative minus 5", -1),
]

PROMISES = [  # docs/rewards.md: thinking opened again and never closed is -1 (so these are scored as the
    # trainer scores them, through rewards.reward); a scale word is the number's, so a restatement in
    # scale words is read as one in digits is
    ("42", "<think>6 x 7</think>The answer is 42.\n<think>\nLet me check that again", -1),
    ("42", "<think>6 x 7 = 42</think>\\boxed{42}\n<think>", -1), ("42", "<think>a</think>42\n<think>b", -1),
    ("2000000", "The answer is 2 million. So 3 million dollars.", -1),
    ("2000000", "The answer is 2,000,000. So 3 million dollars.", -1),
    ("2000000", r"\boxed{2000000}. That is 3 million.", -1),
    ("2000000", "The answer is 2,000,000. In words: 3 million.", -1),
    ("1500", "Answer: 1.5 thousand. So 2 thousand dollars.", -1),
    ("42", "<think>6 x 7</think>\n<think>checked: 42</think>\nThe answer is 42.", 1),
    ("2000000", "The answer is 2 million. So 2,000,000 dollars.", 1),
    ("2000000", "The answer is 2,000,000. So 2 million dollars.", 1),
    ("2000000", r"\boxed{2000000}. That is 2 million.", 1),
]
