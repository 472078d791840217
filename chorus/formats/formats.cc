// The formats module: bounds-checked readers/writers of model files (see the headers).
