def truncation_warnings(pipe, prompt, max_sequence_length=None):
    return []
