// The tokenizer module (see the headers).
