"""What a kernel is to the hook, and what this machine keeps of it: its identity (the registry's content address), the
per-machine kernel cache, the errors TVM raises, the threads and CPU it runs on, local timing, and work done in the
background. The lowest layer: it imports nothing else of the hook's."""
