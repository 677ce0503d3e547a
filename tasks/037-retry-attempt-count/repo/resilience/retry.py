import time


def retry(func, max_retries=3, delay=0.1, backoff=2.0, exceptions=(Exception,),
          on_retry=None, sleep=time.sleep):
    """Call ``func``; on failure retry up to ``max_retries`` times with exponential backoff."""
    attempt = 0
    wait = delay
    while True:
        try:
            return func()
        except exceptions as exc:
            attempt += 1
            if attempt >= max_retries:
                raise
            if on_retry is not None:
                on_retry(attempt, exc)
            sleep(wait)
            wait *= backoff
