"""placeholder"""
class VLLMBackend:  # noqa
    pass
