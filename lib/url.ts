/** A URL as logs may show it: without the user name and password it may carry. */
export function safeUrl(url: string): string {
  try {
    const u = new URL(url);
    u.username = '';
    u.password = '';
    return u.toString();
  } catch {
    return '(invalid url)';
  }
}
